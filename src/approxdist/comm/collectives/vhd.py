"""VHD: vector halving / distance doubling (Rabenseifner), for large messages (seed 001).

Reduce-scatter by recursive halving: with p ranks the vector is cut into p blocks
(`bounds`); at distance d = p/2, p/4, ..., 1 a rank exchanges half of its current block
range with rank XOR d (the rank whose d-bit is 0 keeps the lower half) and adds what it
receives. After log2 p steps rank r owns block r, reduced. It `share`s that block once;
the all-gather by distance doubling (d = 1, 2, ..., p/2) swaps the held block ranges,
whose payloads travel concatenated and unchanged. 2 log2 p steps, at most 2 M bytes
per rank. Non-powers of two fold (`fold`).
"""

from __future__ import annotations

import torch

from approxdist.comm.collectives.algorithm import Algorithm
from approxdist.comm.collectives.base import bounds
from approxdist.comm.collectives.fold import run_folded
from approxdist.comm.collectives.wire import Wire


def _span(blocks: list[tuple[int, int]], lo: int, hi: int) -> tuple[int, int]:
    """Element range of blocks [lo, hi)."""
    return blocks[lo][0], blocks[hi - 1][1]


def _halving(wire: Wire, x: torch.Tensor, blocks: list[tuple[int, int]]) -> None:
    lo, hi, d = 0, wire.world_size, wire.world_size // 2
    while d >= 1:
        partner, mid = wire.rank ^ d, (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if wire.rank & d == 0 else ((mid, hi), (lo, mid))
        ka, kb = _span(blocks, *keep)
        ga, gb = _span(blocks, *give)
        wire.reduce_step(partner, x[ga:gb], partner, x[ka:kb])
        lo, hi = keep
        d //= 2


def _doubling_gather(wire: Wire, x: torch.Tensor, blocks: list[tuple[int, int]]) -> None:
    a, b = blocks[wire.rank]
    held = [wire.share(x[a:b])]  # payload bytes of the blocks this rank holds, in order
    lo, size, d = wire.rank, 1, 1
    while d < wire.world_size:
        plo = lo ^ d  # the partner holds as many blocks, on the other side of bit d
        theirs_blocks = blocks[plo:plo + size]
        pa, pb = _span(blocks, plo, plo + size)
        target: int | torch.Tensor
        if wire.raw:  # values travel in place: send our span, receive into theirs
            ma, mb = _span(blocks, lo, lo + size)
            send, target = x[ma:mb].view(torch.uint8), x[pa:pb].view(torch.uint8)
        else:
            send = torch.cat(held) if len(held) > 1 else held[0]
            target = sum(wire.nbytes(e - s) for s, e in theirs_blocks)
        (data,) = wire.exchange([(wire.rank ^ d, send)], [(wire.rank ^ d, target)])
        theirs = _split(wire, data, theirs_blocks)
        for (s, e), part in zip(theirs_blocks, theirs):
            wire.land(x[s:e], part)
        held = held + theirs if plo > lo else theirs + held
        lo, size, d = min(lo, plo), 2 * size, 2 * d


def _split(wire: Wire, data: torch.Tensor, blocks: list[tuple[int, int]]) -> list[torch.Tensor]:
    out, at = [], 0
    for s, e in blocks:
        n = wire.nbytes(e - s)
        out.append(data[at:at + n])
        at += n
    return out


def _vhd(wire: Wire, x: torch.Tensor) -> None:
    blocks = bounds(x.numel(), wire.world_size)
    _halving(wire, x, blocks)
    _doubling_gather(wire, x, blocks)


class Vhd(Algorithm):
    name = "vhd"

    def run(self, wire: Wire, x: torch.Tensor) -> None:
        if wire.world_size > 1 and x.numel():
            run_folded(_vhd, wire, x)
