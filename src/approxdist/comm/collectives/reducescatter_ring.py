"""Ring reduce-scatter: each chunk's partial sum travels n-1 hops, pipelined in segments.

Chunk c starts at member c+1, which sends its own values; each next member adds its own
values to the partial sum it received and sends that on, and member c adds last
(`layout.ring_scatter_order`, `layout.ring_sum_order`). Every hop encodes the partial
sum of one value segment (`layout.value_segments`) and the receiver decodes it and adds
in fp32, so a value's sum is encoded n-1 times on its way. All receives of all steps are
posted at once and segment j of step s+1 leaves as soon as segment j of step s is added,
overlapping additions and transfers as the ring all-reduce does (`ring.py`). Per member
(n-1) C bytes sent for chunks of C wire bytes: optimal in bandwidth. The input is not
changed: partial sums go to reused buffers, the last one into the result.
"""

from __future__ import annotations

import torch

from approxdist.comm.collectives.base import Pending, Recv
from approxdist.comm.collectives.layout import ring_scatter_order, value_segments
from approxdist.comm.collectives.wire import Wire


def ring(wire: Wire, chunks: list[torch.Tensor], result: torch.Tensor) -> None:
    """`result` = the sum over all members of their chunk `wire.rank` of `chunks` (n > 1
    and chunks not empty: `ReduceScatter` calls no algorithm otherwise)."""
    n, r = wire.world_size, wire.rank
    k = result.numel()
    segs = value_segments(k, wire.segment_bytes)
    sizes = [wire.nbytes(b - a) for a, b in segs]
    buf = wire.scratch.get("scatter", (n - 1) * sum(sizes), torch.uint8, wire.device)
    partial = wire.scratch.get("partial", (n - 2) * k, torch.float32, wire.device)
    sums = [partial[s * k:(s + 1) * k] for s in range(n - 2)] + [result]
    left, right = (r - 1) % n, (r + 1) % n
    recvs: list[Recv] = []
    at = 0
    for _ in range(n - 1):
        for size in sizes:
            recvs.append((left, buf[at:at + size]))
            at += size
    pending = wire.comm.start([], recvs)
    first = chunks[(r - 1) % n]
    sent: list[Pending] = [wire.comm.start([(right, wire.pack(first[a:b]))], [])
                           for a, b in segs]
    index = 0
    for s, c in enumerate(ring_scatter_order(r, n)):
        for a, b in segs:
            wire.sum_into(sums[s][a:b], chunks[c][a:b], pending.recv(index))
            index += 1
            if s < n - 2:
                sent.append(wire.comm.start([(right, wire.pack(sums[s][a:b]))], []))
    pending.finish()
    for p in sent:
        p.finish()
