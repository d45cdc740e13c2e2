"""Direct all-gather: every member sends its block to every other member in one step.

Member r encodes its own block once (`Wire.share`), posts the receives of the n-1
other blocks and sends its bytes to r+1, r+2, ... (`layout.direct_peers`) in the same
batch. One step instead of the ring's n-1, with the same (n-1) B bytes sent per member,
so it suits small blocks, where the ring's per-step latency dominates.
"""

from __future__ import annotations

import torch

from approxdist.comm.collectives.layout import direct_peers
from approxdist.comm.collectives.wire import Wire


def direct(wire: Wire, blocks: list[torch.Tensor]) -> None:
    """Fill every member's block of `blocks` (this member's holds its values; n > 1, and
    blocks are not empty: `AllGather` calls no algorithm otherwise)."""
    n, r = wire.world_size, wire.rank
    payload = wire.share(blocks[r])
    to, sources = direct_peers(r, n)
    targets = wire.block_targets(blocks, sources)
    pending = wire.comm.start([(p, payload) for p in to], list(zip(sources, targets)))
    for i, (p, target) in enumerate(zip(sources, targets)):
        data = pending.recv(i)
        if wire.raw:
            wire.keep(target, data)
        else:
            wire.land(blocks[p], data)
    pending.finish()
