"""`auto`'s calibration without asking: measured once per machine and world, cached, shared.

`resolve(link, spec)` turns a calibration spec into what the `auto` algorithm reads:

| spec | `auto` uses |
|---|---|
| `off` | the alpha-beta model (`model.DEFAULT` + the emulated link), no measurement |
| a path | that file (`approxdist bench allreduce --calibrate` writes one) |
| `measure` | the cached calibration of this machine, world size, backend, ranks per node and
  link; measured now if there is none |
| `None` (not given) | `APPROXDIST_ALLREDUCE_CALIBRATION` if set (off, measure or a path), else `measure` |

`measure` is collective over the link's group and runs where every member builds its
all-reduce at once (`DataParallel`'s communication pool, `bench allreduce`), never on a
communication thread. Member 0 looks in its cache (`$APPROXDIST_CACHE_DIR`, else
`$XDG_CACHE_HOME/approxdist`, else `~/.cache/approxdist`; one JSON file per key); a file that
is not a calibration of this key is reported in one line, deleted and rebuilt, never
trusted. Without one, every member times each of `auto`'s candidates (native, ring, brb,
brd, vhd) on sizes from 4 KiB up, interleaved in rounds (at least `ROUNDS`, more where
they are cheap), each op after a barrier, with the argument check the runs use, and
timed as its slowest member's (as `bench allreduce` times), while the next size's forecast
(a line through the last two sizes' round times) fits the time budget (`BUDGET_S`;
member 0 decides before each size, so a slow link stops at a smaller size instead of
overrunning it); member 0 fits the thresholds (`calibration.fit`, by median time) and
saves them. Member 0's
calibration is then sent to every member, so all choose the same algorithm for every size
(a disagreement would deadlock), also across machines. Member 0 keeps the result per key
in memory, so later all-reduces of the same world pay one small message, not a file read;
every member takes part in that message each time, as the members of a group may not all
have met the key before.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Mapping
from hashlib import sha256
from pathlib import Path

import torch

from approxdist.bench.stats import median, paired_ratio
from approxdist.cache import cache_dir
from approxdist.comm.collectives.calibration import Calibration, Measurement, fit
from approxdist.comm.link import Link
from approxdist.errors import ConfigError

ENV = "APPROXDIST_ALLREDUCE_CALIBRATION"
CANDIDATES = ("native", "ring", "brb", "brd", "vhd")
SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)
ROUNDS = 9  # measured rounds per size, at least (`_rounds`)
#: rounds of a cheap size: where ranks share cores, 30-40 % of ops take a scheduler tick
#: longer (at 1 MiB on 2 ranks 3-8 ms instead of 1-1.6), so the median over 40 rounds
#: picked an algorithm more than 1.15x slower than the best in 6-8 % of windows at 1 MiB;
#: over 80 rounds in 2-3 % (`calibration_windows`, docs/collectives.md "Why 80 rounds")
MAX_ROUNDS = 80
#: seconds a size's measured rounds may take when `ROUNDS` would take less
SIZE_S = 2.5
#: seconds the measurement may take: member 0 starts a size only if the time so far plus
#: the next size's forecast (`_forecast`) fits in it
BUDGET_S = 10.0

_memory: dict[str, str] = {}  # member 0's calibrations by key, as JSON
_lock = threading.Lock()


def resolve(link: Link, spec: Calibration | str | Path | None,
            algorithm: str = "auto") -> Calibration | str | Path | None:
    """What `auto` should read for `spec` on `link`'s group (see the module docstring);
    other algorithms and `off` need nothing (None)."""
    if isinstance(spec, Calibration) or algorithm != "auto":
        return spec
    text = str(spec) if spec is not None else os.environ.get(ENV, "measure")
    if text in ("", "measure"):
        return measured(link)
    if text == "off":
        return None
    return Path(text)


def key(link: Link) -> str:
    """What a calibration is valid for: this machine, the world, backend, ranks per node,
    the emulated link and the torch version (the cache file's name is its hash)."""
    per_node = os.environ.get("LOCAL_WORLD_SIZE", str(link.world_size))
    return (f"host={platform.node()} cpus={os.cpu_count()} world={link.world_size} "
            f"backend={'nccl' if link.device.type == 'cuda' else 'gloo'} per_node={per_node} "
            f"link={link.spec.spec if link.spec else 'none'} torch={torch.__version__}")


def cache_path(k: str) -> Path:
    return cache_dir() / "allreduce" / f"{sha256(k.encode()).hexdigest()[:20]}.json"


def measured(link: Link) -> Calibration | None:
    """The calibration every member of `link`'s group agrees on (collective)."""
    if link.world_size == 1:
        return None
    k = key(link)
    with _lock:
        # member 0 alone decides, also from its memory: the members of this group may not
        # all have met this key before (ranks 1 and 2 of a 3-rank job can form a 2-rank
        # group after ranks 0 and 1 did), and a member that skipped the exchange would
        # leave the others waiting for it
        text = (_memory.get(k) or _cached(k)) if link.rank == 0 else None
        text = _share(link, text)
        if not text:
            t0 = time.perf_counter()
            measured = _measure(link)
            if link.rank == 0:
                cal = fit(measured, link.world_size, link.spec.spec if link.spec else "none")
                text = json.dumps({"key": k, "calibration": cal.to_json()})
                _save(k, text)
                print(f"approxdist: calibrated the auto all-reduce for {link.world_size} ranks "
                      f"in {time.perf_counter() - t0:.1f} s; cached in {cache_path(k)}",
                      file=sys.stderr)
            text = _share(link, text)
        if link.rank == 0:
            _memory[k] = text
        return Calibration.from_json(json.loads(text)["calibration"])


def _cached(k: str) -> str | None:
    """Member 0's cached calibration of key `k`, or None (a bad file is removed)."""
    path = cache_path(k)
    if not path.is_file():
        return None
    try:
        text = path.read_text()
        raw = json.loads(text)
        if raw.get("key") != k:
            raise ValueError(f"it is for {raw.get('key')!r}")
        Calibration.from_json(raw["calibration"])
        return text
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ConfigError) as exc:
        print(f"approxdist: ignoring the cached all-reduce calibration {path} ({exc}); "
              f"measuring again", file=sys.stderr)
        path.unlink(missing_ok=True)
        return None


def _save(k: str, text: str) -> None:
    path = cache_path(k)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:  # a read-only home still trains, it just measures next time
        print(f"approxdist: cannot cache the all-reduce calibration in {path} ({exc})",
              file=sys.stderr)


def _share(link: Link, text: str | None) -> str:
    """Member 0's `text` ("" for none) on every member."""
    if link.rank == 0:
        raw = (text or "").encode()
        data = torch.tensor(list(raw), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64).view(torch.uint8)
        peers = range(1, link.world_size)
        _, sends = link.post_bytes([(p, size) for p in peers], [])
        for s in sends:
            s.wait()
        if data.numel():
            _, sends = link.post_bytes([(p, data) for p in peers], [])
            for s in sends:
                s.wait()
        return text or ""
    (got,), _ = link.post_bytes([], [(0, 8)])
    n = int(got.wait().view(torch.int64).item())
    if n == 0:
        return ""
    (body,), _ = link.post_bytes([], [(0, n)])
    return bytes(body.wait().tolist()).decode()


def _measure(link: Link) -> list[Measurement]:
    """Every candidate at each size, interleaved; the paired ratio to native per size.

    Each op runs with the argument check the runs use (`AllReduce`'s default: the heads on
    one host, the handshake across hosts): it costs our algorithms 0.1-0.5 ms a call on
    loopback and `native` nothing, and a calibration timed without it chose brb at 1 MiB on
    2 ranks where native was 1.4x faster in `bench allreduce`. After a warm-up round,
    member 0 sets the size's number of rounds (`_rounds`), so every member runs as many."""
    from approxdist.comm.collectives.allreduce import AllReduce

    reducers = {a: AllReduce(link, a, "fp32") for a in CANDIDATES}
    out: list[Measurement] = []
    start = time.perf_counter()
    for i, size in enumerate(SIZES):
        if i:
            done = time.perf_counter() - start + _forecast(out, SIZES[:i], size) > BUDGET_S
            if _share(link, ("1" if done else "0") if link.rank == 0 else None) == "1":
                break
        x = torch.randn(size // 4, generator=torch.Generator().manual_seed(size))
        work = torch.empty_like(x)
        mine: dict[str, list[float]] = {a: [] for a in CANDIDATES}
        rounds, r, warm = ROUNDS, 0, time.perf_counter()
        while r <= rounds:  # round 0 warms up
            took = time_round(link, reducers, work, x, r)
            if r:
                for a, t in took.items():
                    mine[a].append(t)
            if r == 0:
                decided = str(_rounds(time.perf_counter() - warm)) if link.rank == 0 else None
                rounds = int(_share(link, decided))
            r += 1
        times = _slowest(link, mine)
        for a in CANDIDATES:
            out.append(Measurement(a, size, median(times[a]),
                                   paired_ratio(times[a], times["native"])))
    return out


def time_round(link: Link, reducers: Mapping[str, Callable[[torch.Tensor], object]],
               work: torch.Tensor, x: torch.Tensor, r: int) -> dict[str, float]:
    """Round `r`: every candidate once on a copy of `x` (the order reversed on even rounds),
    each after a barrier so that all start together and no op is charged another's tail;
    this member's seconds per algorithm."""
    out = {}
    for a in (CANDIDATES if r % 2 else CANDIDATES[::-1]):
        work.copy_(x)
        link.group.barrier()
        t0 = time.perf_counter()
        reducers[a](work)
        out[a] = time.perf_counter() - t0
    return out


def _rounds(round_s: float) -> int:
    """Measured rounds of a size whose rounds take `round_s` each: as many as fit in
    `SIZE_S`, at least `ROUNDS`, at most `MAX_ROUNDS` (small sizes swing most with the
    scheduler where ranks share cores, and their rounds are cheap)."""
    return int(min(max(SIZE_S / max(round_s, 1e-9), ROUNDS), MAX_ROUNDS))


def _forecast(out: list[Measurement], sizes: tuple[int, ...], size: int) -> float:
    """Seconds the rounds of `size` should take: its round time forecast by a line through
    the round times of the last two sizes measured (alpha dominates small sizes, so scaling
    the last one alone would overshoot by up to the size ratio), or the last one scaled
    after one size; times the warm-up plus the rounds `_rounds` gives it."""
    n = len(CANDIDATES)
    per_round = [sum(m.median_s for m in out[j * n:(j + 1) * n]) for j in range(len(sizes))]
    if len(sizes) == 1:
        one = per_round[0] * size / sizes[0]
    else:
        slope = max(per_round[-1] - per_round[-2], 0.0) / (sizes[-1] - sizes[-2])
        one = per_round[-1] + slope * (size - sizes[-1])
    return one * (1 + _rounds(one))


def _slowest(link: Link, mine: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each op's time on the slowest member (a member's own clock would favour the
    algorithms that finish early on it: the root of brb's tree is done a hop before the
    leaves, and the next op then waits for them)."""
    every = link.group.all_gather_object(mine)
    return {a: [max(ts) for ts in zip(*(m[a] for m in every), strict=True)] for a in mine}
