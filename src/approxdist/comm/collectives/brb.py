"""BRB: binomial-tree reduce to rank 0, then broadcast down the same tree (seed 001).

Rank r's parent is r minus its lowest set bit; its children are r + d for each power of
two d below that bit (every d for rank 0) with r + d < N, so any N works without
folding. A rank posts all its child receives at once, adds them in ascending d (a fixed
order), and sends the partial sum to its parent. Rank 0 `share`s the total once and the
broadcast forwards those bytes unchanged. 2 ceil(log2 N) steps; per rank up to
2 M log2 N bytes (whole vectors), so it suits small messages.
"""

from __future__ import annotations

import torch

from approxdist.comm.collectives.algorithm import Algorithm
from approxdist.comm.collectives.base import ceil_log2
from approxdist.comm.collectives.wire import Wire


def children(rank: int, world: int) -> list[int]:
    """Children of `rank` in the binomial tree rooted at 0, nearest first."""
    low = rank & -rank if rank else 1 << ceil_log2(world)
    out, d = [], 1
    while d < low and rank + d < world:
        out.append(rank + d)
        d *= 2
    return out


def parent(rank: int) -> int | None:
    return rank - (rank & -rank) if rank else None


class Brb(Algorithm):
    name = "brb"

    def run(self, wire: Wire, x: torch.Tensor) -> None:
        if wire.world_size == 1 or x.numel() == 0:
            return
        kids, up = children(wire.rank, wire.world_size), parent(wire.rank)
        got = wire.exchange([], [(k, wire.temp(x.numel(), slot=i)) for i, k in enumerate(kids)])
        for data in got:
            wire.accumulate(x, data)
        if up is None:
            payload = wire.share(x)
        else:
            # send the partial sum up and post the receive of the total in one batch
            (payload,) = wire.exchange([(up, wire.pack(x))], [(up, wire.into(x))])
            wire.land(x, payload)
        wire.exchange([(k, payload) for k in kids], [])
