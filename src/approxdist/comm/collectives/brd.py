"""BRD: butterfly recursive doubling, the whole vector every step (seed 001).

In step k each rank exchanges its whole vector with rank XOR 2^k and both add: log2 N
steps, M log2 N bytes per rank; the fewest steps, so the best for small messages.
IEEE addition is commutative, so partners compute the same bits; with a lossy codec
both add the *decoded* copies of the two sent payloads (a rank keeps the decoded value
of what it sent), so they stay bitwise identical. Non-powers of two fold (`fold`).
"""

from __future__ import annotations

import torch

from approxdist.comm.collectives.algorithm import Algorithm
from approxdist.comm.collectives.fold import run_folded
from approxdist.comm.collectives.wire import Wire


def _doubling(wire: Wire, x: torch.Tensor) -> None:
    d = 1
    while d < wire.world_size:
        partner = wire.rank ^ d
        wire.reduce_step(partner, x, partner, x, shared=True)
        d *= 2


class Brd(Algorithm):
    name = "brd"

    def run(self, wire: Wire, x: torch.Tensor) -> None:
        if wire.world_size > 1 and x.numel():
            run_folded(_doubling, wire, x)
