"""Ring all-reduce: reduce-scatter then all-gather around the ring, 2(N-1) steps (seed 001).

Each rank sends to rank+1 and receives from rank-1. The vector is cut into N chunks
(`bounds`); in reduce-scatter step s rank r sends chunk r-s and adds the received chunk
r-s-1, so after N-1 steps it owns chunk r+1 fully reduced. The owner `share`s it once;
the all-gather forwards those bytes unchanged for N-1 steps. Per rank it sends
2 M (N-1)/N bytes, optimal in bandwidth; any N works without folding.

Pipelined like gloo's ring: every chunk travels in segments (`Wire.segments`), all
receives of all steps are posted at once, and segment j of step s+1 is sent as soon as
segment j of step s has been added (or, in the all-gather, has arrived), so transfers
of one step overlap the additions of the previous one. Received all-gather segments
land directly in the result on the exact fp32 path. Segments are 4 MiB (a step-bound
algorithm needs finer ones to overlap its additions; the ring overlaps across steps).
"""

from __future__ import annotations

import torch

from approxdist.comm.collectives.algorithm import Algorithm
from approxdist.comm.collectives.base import Pending, Recv, bounds
from approxdist.comm.collectives.wire import Wire


def _recv_targets(wire: Wire, steps: list[list[torch.Tensor]], reduce_steps: int) -> list[Recv]:
    """One receive per (step, segment): scratch for additions, the result for the gather."""
    left = (wire.rank - 1) % wire.world_size
    sizes = [wire.nbytes(seg.numel()) for segs in steps[:reduce_steps] for seg in segs]
    buf = wire.scratch.get("ring", sum(sizes), torch.uint8, wire.device)
    recvs: list[Recv] = []
    at = 0
    for s, segs in enumerate(steps):
        for seg in segs:
            if s < reduce_steps:
                n = wire.nbytes(seg.numel())
                recvs.append((left, buf[at:at + n]))
                at += n
            else:
                recvs.append((left, wire.into(seg)))
    return recvs


class Ring(Algorithm):
    name = "ring"
    # segments pipeline across steps here, so fewer, larger ones save per-message CPU
    segment_bytes = 4 << 20

    def run(self, wire: Wire, x: torch.Tensor) -> None:
        n, r = wire.world_size, wire.rank
        if n == 1 or x.numel() == 0:
            return
        chunks = [x[a:b] for a, b in bounds(x.numel(), n)]
        right = (r + 1) % n
        # the chunk received in each step: n-1 reduce-scatter steps, then n-1 all-gather steps
        received = [chunks[(r - s - 1) % n] for s in range(n - 1)] + \
                   [chunks[(r - s) % n] for s in range(n - 1)]
        steps = [[seg for seg in wire.segments(c) if seg.numel()] for c in received]
        pending = wire.comm.start([], _recv_targets(wire, steps, n - 1))
        # each first segment leaves as soon as it is encoded
        later: list[Pending] = [wire.comm.start([(right, wire.pack(seg))], [])
                                for seg in wire.segments(chunks[r]) if seg.numel()]
        index = 0
        for s, segs in enumerate(steps):
            for seg in segs:
                data = pending.recv(index)
                index += 1
                if s < n - 1:
                    wire.accumulate(seg, data)
                    out = wire.share(seg) if s == n - 2 else wire.pack(seg)
                else:
                    wire.land(seg, data)
                    out = data
                if s + 1 < len(steps):
                    later.append(wire.comm.start([(right, out)], []))
        pending.finish()
        for p in later:
            p.finish()
