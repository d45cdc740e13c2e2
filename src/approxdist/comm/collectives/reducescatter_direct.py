"""Direct reduce-scatter: every member sends chunk j straight to member j in one step.

Member r encodes each other member's chunk once and sends it to r+1, r+2, ...
(`layout.direct_peers`); it receives its own chunk from r-1, r-2, ... and adds the
decoded values to its own in that order (`layout.direct_sum_order`). One step instead
of the ring's n-1 with the same (n-1) C bytes sent per member, and each value is encoded
once, not n-1 times, so with a lossy codec its error is smaller; the receiver does all
n-1 additions after the transfers, where the ring overlaps them, so it suits small chunks.
"""

from __future__ import annotations

import torch

from approxdist.comm.collectives.layout import direct_peers
from approxdist.comm.collectives.wire import Wire


def direct(wire: Wire, chunks: list[torch.Tensor], result: torch.Tensor) -> None:
    """`result` = the sum over all members of their chunk `wire.rank` of `chunks` (n > 1
    and chunks not empty: `ReduceScatter` calls no algorithm otherwise)."""
    n, r = wire.world_size, wire.rank
    k = result.numel()
    result.copy_(chunks[r])
    to, sources = direct_peers(r, n)
    nbytes = wire.nbytes(k)
    buf = wire.scratch.get("scatter", (n - 1) * nbytes, torch.uint8, wire.device)
    recvs = [(p, buf[i * nbytes:(i + 1) * nbytes]) for i, p in enumerate(sources)]
    pending = wire.start([(p, wire.pack(chunks[p])) for p in to], recvs)
    for i in range(n - 1):
        wire.accumulate(result, pending.recv(i))
    pending.finish()
