"""Ring all-gather: every block travels n-1 hops around the ring, pipelined in segments.

Member r encodes its own block once (`Wire.share`) and sends it to r+1; in step s it
forwards the block it received in step s-1 (`layout.ring_gather_order`), as bytes,
never re-encoded. Each block's bytes move in byte segments (`layout.byte_segments`);
all receives of all steps are posted at once, and a received segment is forwarded as
soon as it is in, so steps overlap as in gloo's ring. Per member (n-1) B bytes sent for
blocks of B wire bytes: optimal in bandwidth. On the exact fp32 path segments land in
the result itself; otherwise a block is decoded once all its bytes are in.
"""

from __future__ import annotations

import torch

from approxdist.comm.collectives.base import Pending
from approxdist.comm.collectives.layout import byte_segments, ring_gather_order
from approxdist.comm.collectives.wire import Wire


def ring(wire: Wire, blocks: list[torch.Tensor]) -> None:
    """Fill every member's block of `blocks` (this member's holds its values; n > 1, and
    blocks are not empty: `AllGather` calls no algorithm otherwise)."""
    n, r = wire.world_size, wire.rank
    numel = blocks[r].numel()
    payload = wire.share(blocks[r])
    # segments are counted in fp32 values (bytes / 4 for an all-gather of bytes)
    cuts = byte_segments(wire.nbytes(numel), -(-numel * wire.itemsize // 4), wire.segment_bytes)
    order = ring_gather_order(r, n)
    targets = wire.block_targets(blocks, order)
    left, right = (r - 1) % n, (r + 1) % n
    pending = wire.comm.start([], [(left, t[a:b]) for t in targets for a, b in cuts])
    sent: list[Pending] = [wire.comm.start([(right, payload[a:b])], []) for a, b in cuts]
    index = 0
    for s, target in enumerate(targets):
        for a, b in cuts:
            wire.keep(target[a:b], pending.recv(index))
            index += 1
            if s < n - 2:
                sent.append(wire.comm.start([(right, target[a:b])], []))
        if not wire.raw:
            wire.land(blocks[order[s]], target)
    pending.finish()
    for p in sent:
        p.finish()
