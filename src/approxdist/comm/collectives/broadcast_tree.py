"""Tree broadcast: the root's bytes down a binomial tree, pipelined in segments.

The root encodes its tensor once (`Wire.share`); every other member receives those bytes
from its parent in byte segments (`layout.byte_segments`) and forwards each segment to
its children (`layout.tree`, farthest first) as soon as it is in, so the tree's levels
overlap. ceil(log2 n) levels: few steps for small messages, and pipelined for large ones;
every member sends at most ceil(log2 n) copies, n-1 copies move in all. Members decode
the bytes once all are in (on the exact fp32 path they land in the tensor itself).
"""

from __future__ import annotations

import torch

from approxdist.comm.collectives import layout
from approxdist.comm.collectives.base import Pending
from approxdist.comm.collectives.wire import Wire


def tree(wire: Wire, x: torch.Tensor, root: int) -> None:
    """Member `root`'s values of `x` into every member's `x` (flat, contiguous fp32; n > 1
    and `x` not empty: `Broadcast` calls no algorithm otherwise)."""
    n, r = wire.world_size, wire.rank
    up, kids = layout.tree(r, root, n)
    nbytes = wire.nbytes(x.numel())
    cuts = layout.byte_segments(nbytes, x.numel(), wire.segment_bytes)
    sent: list[Pending] = []
    if up is None:
        payload = wire.share(x)
        sent = [wire.comm.start([(k, payload[a:b]) for k in kids], []) for a, b in cuts]
    else:
        target = x.view(torch.uint8) if wire.raw else \
            wire.scratch.get("broadcast", nbytes, torch.uint8, wire.device)
        pending = wire.comm.start([], [(up, target[a:b]) for a, b in cuts])
        for i, (a, b) in enumerate(cuts):
            wire.keep(target[a:b], pending.recv(i))
            if kids:
                sent.append(wire.comm.start([(k, target[a:b]) for k in kids], []))
        pending.finish()
        if not wire.raw:
            wire.land(x, target)
    for p in sent:
        p.finish()
