"""Exact fp32 through `Link.isend` / `Link.irecv` in the split layout (`comm/raw.py`) on gloo
ranks: the exact values for contiguous and strided inputs on both sides of the size
threshold, sized and self-describing, with and without an emulated link; the bytes
counted as for the framed payload; received tensors never overwritten by later receives."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from approxdist.comm import raw
from approxdist.comm.codecs import get_codec
from approxdist.comm.link import RETIRED_REQUESTS, Link
from approxdist.comm.transfer import SHAPE_WORDS
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks

LIMIT = max(1, raw.SPLIT_MIN_BYTES // 4)  # values at the threshold
N = 4096
#: (rows, cols, transposed): element counts just under, at and over the threshold, small
#: and transposed (not contiguous), 4 MiB, 4 MiB transposed
CASES = [(LIMIT - 1, 1, False), (LIMIT, 1, False), (LIMIT + 1, 1, False), (7, 9, True),
         (256, 4096, False), (1024, 1024, True)]


def _data(i: int, rows: int, cols: int, transposed: bool) -> torch.Tensor:
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(i))
    return x.t() if transposed else x  # a transposed view is not contiguous


def _shape(rows: int, cols: int, transposed: bool) -> tuple[int, int]:
    return (cols, rows) if transposed else (rows, cols)


def _exchange(ctx: DistContext, spec: str | None, describe: bool) -> dict[str, Any]:
    link, fp32 = Link(ctx, spec), get_codec("fp32")
    out: dict[str, Any] = {}
    if ctx.rank == 0:
        handles = [link.isend(_data(i, *c), 1, fp32, describe=describe)
                   for i, c in enumerate(CASES)]
        # a strided slice with a storage offset, and an fp16 tensor (cast to fp32 once)
        big = _data(99, 2 * N, 2, False)
        handles.append(link.isend(big[1::2, 1], 1, fp32, describe=describe))
        handles.append(link.isend(big[::2, 0].half(), 1, fp32, describe=describe))
        for h in handles:
            h.wait()
        out["sent"], out["messages"] = dict(link.stats.sent), dict(link.stats.messages_sent)
    else:
        shapes = [None if describe else _shape(*c) for c in CASES] + \
            [None if describe else N] * 2
        handles = [link.irecv(0, s, fp32) for s in shapes]
        got = [h.wait() for h in reversed(handles)][::-1]  # waited out of order
        big = _data(99, 2 * N, 2, False)
        want = [_data(i, *c) for i, c in enumerate(CASES)] + [big[1::2, 1], big[::2, 0].half().float()]
        out["exact"] = [g.shape == w.shape and g.dtype == torch.float32 and torch.equal(g, w)
                        for g, w in zip(got, want)]
        out["received"] = dict(link.stats.received)
        out["messages"] = dict(link.stats.messages_received)
    link.close()
    return out


def _expected() -> tuple[int, int]:
    """(bytes, messages) for the sends of `_exchange` without shape headers."""
    fp32 = get_codec("fp32")
    counts = [r * c for r, c, _ in CASES] + [N, N]
    nbytes = sum(fp32.payload_nbytes(n) for n in counts)
    messages = sum(2 if raw.splits(fp32, None, n) else 1 for n in counts)
    return nbytes, messages


@pytest.mark.parametrize("spec", [None, "bw=10gbit,lat=20us"])
@pytest.mark.parametrize("describe", [False, True])
def test_exact_values_and_bytes(spec: str | None, describe: bool) -> None:
    r0, r1 = run_on_ranks(_exchange, 2, spec, describe, timeout_s=120)
    assert r1["exact"] == [True] * (len(CASES) + 2)
    nbytes, messages = _expected()
    if describe:  # one 80-byte shape header per tensor
        nbytes += SHAPE_WORDS * 8 * (len(CASES) + 2)
        messages += len(CASES) + 2
    assert r0["sent"] == {1: nbytes} and r1["received"] == {0: nbytes}
    assert r0["messages"] == {1: messages} and r1["messages"] == {0: messages}
    assert messages > len(CASES) + 2 + (len(CASES) + 2) * describe  # some did split


def _no_aliasing(ctx: DistContext, n: int) -> dict[str, Any]:
    """Receive several tensors of one size back to back; each keeps its own values."""
    link, fp32 = Link(ctx), get_codec("fp32")
    out: dict[str, Any] = {}
    if ctx.rank == 0:
        x = torch.zeros(n)
        for i in range(4):  # the same tensor, changed only after its send completed
            x.fill_(float(i))
            link.isend(x, 1, fp32, describe=False).wait()
    else:
        kept = [link.recv(0, n, fp32) for _ in range(2)]
        later = [link.irecv(0, n, fp32) for _ in range(2)]
        kept += [h.wait() for h in later]
        out["values"] = [(float(k.min()), float(k.max())) for k in kept]
        out["distinct"] = len({k.data_ptr() for k in kept}) == len(kept)
    out["retired"] = len(link.retired)  # finished requests kept alive: a bounded few
    link.close()
    return out


@pytest.mark.parametrize("n", [LIMIT, 1 << 18])
def test_received_tensors_are_not_overwritten(n: int) -> None:
    _, r1 = run_on_ranks(_no_aliasing, 2, n, timeout_s=120)
    assert r1["values"] == [(float(i), float(i)) for i in range(4)]
    assert r1["distinct"]
    assert r1["retired"] == RETIRED_REQUESTS  # of 4 or 8 messages: the last two
