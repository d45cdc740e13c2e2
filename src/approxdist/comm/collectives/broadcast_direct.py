"""Direct broadcast: the root sends its bytes to every other member in one step.

The root encodes its tensor once (`Wire.share`) and sends the same bytes to root+1,
root+2, ... (`layout.direct_peers`); every other member receives them from the root and
decodes them. One level instead of the tree's ceil(log2 n), at the price of the root
sending n-1 copies, so it suits small messages.
"""

from __future__ import annotations

import torch

from approxdist.comm.collectives.layout import direct_peers
from approxdist.comm.collectives.wire import Wire


def direct(wire: Wire, x: torch.Tensor, root: int) -> None:
    """Member `root`'s values of `x` into every member's `x` (flat, contiguous fp32; n > 1
    and `x` not empty: `Broadcast` calls no algorithm otherwise)."""
    n, r = wire.world_size, wire.rank
    if r == root:
        payload = wire.share(x)
        wire.start([(p, payload) for p in direct_peers(root, n)[0]], []).finish()
        return
    (data,) = wire.exchange([], [(root, wire.into(x))])
    wire.land(x, data)
