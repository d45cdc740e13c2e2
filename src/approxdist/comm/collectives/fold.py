"""Folding a non-power-of-two world into a power-of-two core (MPICH-style, seed 001).

With N = p + e ranks (p the largest power of two <= N, e extra ranks), the first 2e
ranks pair up as (2i, 2i+1): the odd rank sends its whole vector to the even one, which
adds it and joins the core; ranks 2e..N-1 join the core directly. The core (p ranks,
renumbered 0..p-1 in rank order) runs the power-of-two algorithm. Then every core rank
`share`s its result (encoding once, keeping the decoded value: with exact codecs nothing
changes) and the even ranks send those bytes back to their odd partner, so all N ranks
end bitwise identical. Cost: two extra steps of M bytes for the paired ranks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from approxdist.comm.collectives.base import largest_power_of_two
from approxdist.comm.collectives.peers import SubComm
from approxdist.comm.collectives.wire import Wire

Core = Callable[[Wire, torch.Tensor], None]


def core_members(world: int) -> list[int]:
    """The ranks of the power-of-two core, in core-rank order."""
    extra = world - largest_power_of_two(world)
    return [2 * i for i in range(extra)] + list(range(2 * extra, world))


def run_folded(core: Core, wire: Wire, x: torch.Tensor) -> None:
    """Run `core` (valid for power-of-two worlds) on any world size, in place on `x`."""
    world, rank = wire.world_size, wire.rank
    extra = world - largest_power_of_two(world)
    if extra == 0:
        core(wire, x)
        return
    if rank < 2 * extra and rank % 2 == 1:
        # send our vector (in the segments the partner adds) and post the result's receive
        sends = [(rank - 1, wire.pack(s)) for s in wire.segments(x)]
        pending = wire.start(sends, [(rank - 1, wire.into(x))])
        wire.land(x, pending.recv(0))
        pending.finish()
        return
    if rank < 2 * extra:
        wire.reduce_step(None, x, rank + 1, x)
    core(wire.sub(SubComm(wire.comm, core_members(world))), x)
    result = wire.share(x)
    if rank < 2 * extra:
        wire.exchange([(rank + 1, result)], [])
