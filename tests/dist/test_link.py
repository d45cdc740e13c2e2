"""The link layer on real gloo ranks: sized and self-describing transfers, ordering,
byte accounting, tracing, link emulation and the bit-error channel."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from approxdist.comm.channel import get_channel
from approxdist.comm.codecs import get_codec
from approxdist.comm.link import Link
from approxdist.comm.transfer import SHAPE_WORDS
from approxdist.errors import CommError
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.trace.transfers import TransferEvent

HEADER = SHAPE_WORDS * 8


def _data(i: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(i))


SHAPES = [(3, 4), (0,), (2, 1, 5), (17,)]


def _sender(link: Link) -> None:
    bf16 = get_codec("bf16")
    # sized, fp32, then self-describing bf16, several outstanding
    handles = [link.isend(_data(i, s), 1, describe=False) for i, s in enumerate(SHAPES)]
    handles += [link.isend(_data(10 + i, s), 1, bf16) for i, s in enumerate(SHAPES)]
    handles.append(link.isend(_data(20, (5,)), 1, describe=False))
    for h in handles:
        h.wait()
    noisy = get_channel("ber:0.2@1")
    link.send(torch.ones(4000), 2, get_codec("fp32"), noisy, describe=False)


def _receiver(link: Link) -> dict[str, Any]:
    bf16 = get_codec("bf16")
    sized = [link.irecv(0, s) for s in SHAPES]
    described = [link.irecv(0, None, bf16) for _ in SHAPES]
    last = link.irecv(0, 5)
    # wait out of order: the link posts receives from one peer in order regardless
    got_last = last.wait()
    got_described = [h.wait() for h in reversed(described)][::-1]
    got_sized = [h.wait() for h in sized]
    ok = all(torch.equal(g, _data(i, s)) for i, (g, s) in enumerate(zip(got_sized, SHAPES)))
    ok_d = all(torch.equal(g, _data(10 + i, s).bfloat16().float())
               for i, (g, s) in enumerate(zip(got_described, SHAPES)))
    return {"sized": ok, "described": ok_d, "last": torch.equal(got_last, _data(20, (5,)))}


def _link_cases(ctx: DistContext, spec: str | None) -> dict[str, Any]:
    events: list[TransferEvent] = []
    link = Link(ctx, spec, hook=events.append)
    out: dict[str, Any] = {}
    if ctx.rank == 0:
        _sender(link)
    elif ctx.rank == 1:
        out = _receiver(link)
    else:
        y = link.recv(0, 4000, get_codec("fp32"), get_channel("ber:0.2@1"))
        out = {"finite": bool(torch.isfinite(y).all()), "changed": not torch.equal(y, torch.ones(4000)),
               "nonfinite": link.stats.nonfinite}
    for bad_peer in (ctx.rank, 7):
        try:
            link.isend(torch.ones(1), bad_peer)
        except CommError as exc:
            out.setdefault("errors", []).append(str(exc))
    link.close()
    out.update(sent=dict(link.stats.sent), received=dict(link.stats.received),
               events=[(e.direction, e.peer, e.nbytes, e.end_s >= e.start_s) for e in events])
    return out


def _expected_bytes() -> tuple[int, int]:
    fp32, bf16 = get_codec("fp32"), get_codec("bf16")
    to1 = sum(fp32.payload_nbytes(torch.Size(s).numel()) for s in SHAPES)
    to1 += sum(HEADER + bf16.payload_nbytes(torch.Size(s).numel()) for s in SHAPES)
    to1 += fp32.payload_nbytes(5)
    return to1, fp32.payload_nbytes(4000)


@pytest.mark.parametrize("spec", [None, "bw=20gbit,lat=50us"])
def test_transfers_accounting_and_trace(spec: str | None) -> None:
    r0, r1, r2 = run_on_ranks(_link_cases, 3, spec, timeout_s=90)
    assert r1["sized"] and r1["described"] and r1["last"]
    assert r2["finite"] and r2["changed"] and r2["nonfinite"] > 0
    to1, to2 = _expected_bytes()
    assert r0["sent"] == {1: to1, 2: to2}
    assert r1["received"] == {0: to1} and r2["received"] == {0: to2}
    # one event per message; headers and payloads are separate messages
    assert sum(n for d, p, n, ok in r0["events"] if d == "send" and ok) == to1 + to2
    assert sum(n for d, p, n, ok in r1["events"] if d == "recv" and ok) == to1
    for r in (r0, r1, r2):
        assert len(r["errors"]) == 2 and all("is not another member" in e for e in r["errors"])
