"""`auto`'s automatic calibration (`comm/collectives/autocal.py`), on one set of 2 ranks:

* `auto` with an empty cache measures every candidate, member 0 fits and caches it, and
  every member ends with member 0's thresholds (so all choose the same algorithm);
* a second process-fresh `auto` reads the cache instead of measuring;
* a corrupt cache file is reported, removed and rebuilt, never trusted;
* `off` and the environment default give the alpha-beta model (None);
* `DataParallel(calibration="measure")` trains with the agreed calibration.
The sizes are cut to two small ones to keep it short; what is checked is agreement and
the cache, never which algorithm wins (that is a timing).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from approxdist.comm.collectives import autocal
from approxdist.comm.link import Link
from approxdist.data_parallel import DataParallel
from approxdist.launch.context import DistContext
from approxdist.launch.group import new_group
from approxdist.launch.spawn import run_on_ranks


def _cases(ctx: DistContext, cache: str) -> dict[str, Any]:
    os.environ["APPROXDIST_CACHE_DIR"] = cache
    autocal.SIZES = (4 << 10, 64 << 10)
    link = Link(ctx)
    out: dict[str, Any] = {}
    path = autocal.cache_path(autocal.key(link))
    first = autocal.resolve(link, "measure")
    assert first is not None
    out["first"] = first.to_json()
    out["cached"] = path.is_file()
    autocal._memory.clear()
    out["measured_again"] = False
    real = autocal._measure

    def spy(lk: Link) -> Any:
        out["measured_again"] = True
        return real(lk)

    autocal._measure = spy  # type: ignore[assignment]
    second = autocal.resolve(link, "measure")
    out["second"] = second.to_json() if second is not None else None
    out["second_measured"] = out["measured_again"]
    autocal._memory.clear()
    if ctx.rank == 0:
        path.write_text('{"key": "someone else"')
    torch.distributed.barrier()
    third = autocal.resolve(link, "measure")
    out["rebuilt"] = third.to_json() if third is not None else None
    out["rebuilt_measured"] = out["measured_again"]
    out["off"] = autocal.resolve(link, "off")
    os.environ[autocal.ENV] = "off"
    out["env_off"] = autocal.resolve(link, None)
    out["file_ok"] = path.is_file() and "someone else" not in path.read_text()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    dp = DataParallel(model, ctx=ctx, calibration="measure", threads=1)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(ctx.rank))
    dp(x).sum().backward()
    dp.wait()
    out["grad"] = model[0].weight.grad.clone()
    dp.close()
    link.close()
    return out


def test_auto_calibration_is_agreed_cached_and_rebuilt(tmp_path: Path) -> None:
    r0, r1 = run_on_ranks(_cases, 2, str(tmp_path / "cache"))
    assert r0["first"] == r1["first"]  # member 0's thresholds on every member
    assert {m["algorithm"] for m in r0["first"]["measured"]} == set(autocal.CANDIDATES)
    assert r0["cached"]  # member 0 wrote the cache
    assert r0["second"] == r0["first"] == r1["second"]
    assert not r0["second_measured"] and not r1["second_measured"]  # read from the cache
    assert r0["rebuilt_measured"] and r1["rebuilt_measured"]  # the corrupt file was not used
    assert r0["rebuilt"] == r1["rebuilt"] and r0["file_ok"]
    assert r0["off"] is None and r0["env_off"] is None
    assert torch.equal(r0["grad"], r1["grad"])


def _overlapping_groups(ctx: DistContext, cache: str) -> dict[str, Any]:
    os.environ["APPROXDIST_CACHE_DIR"] = cache
    autocal.SIZES = (4 << 10,)
    first, second = new_group(ctx, [0, 1], "first"), new_group(ctx, [1, 2], "second")
    out: dict[str, Any] = {}
    for name, group in (("first", first), ("second", second)):
        if group is not None:  # rank 1 meets the key again in "second"; rank 2 for the first time
            link = Link(ctx, group=group)
            cal = autocal.resolve(link, "measure")
            out[name] = cal.to_json() if cal is not None else None
            link.close()
    return out


def test_groups_that_share_a_key_agree_without_waiting(tmp_path: Path) -> None:
    """Two 2-rank groups of a 3-rank job have one key; the second group's members have not
    all met it (rank 2 has not): every member still takes part in member 0's exchange, so
    none waits for a message that never comes (a deadlock before) and all agree."""
    r0, r1, r2 = run_on_ranks(_overlapping_groups, 3, str(tmp_path / "cache"), timeout_s=120)
    assert r0["first"] is not None and r0["first"] == r1["first"]
    assert r1["second"] == r2["second"] == r1["first"]
