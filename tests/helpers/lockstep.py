"""N workers' compressors driven in lockstep in one process, combined as the collective would.

All-reduce compatible compressors: every round's messages are summed in worker order and
the sum handed to each worker; the others: every worker's payload is handed to all.
Also records the bytes each worker's messages held.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.compressors import Compressor


def _nbytes(message: Any) -> int:
    if isinstance(message, Payload):
        return message.wire_bytes
    return int(message.numel() * message.element_size())


def lockstep(compressors: Sequence[Compressor], grads: Sequence[torch.Tensor],
             sent: list[int] | None = None,
             shares: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Each worker's result of one exchange; `sent` gets each worker's message bytes,
    `shares` (one flat fp32 tensor a worker) each worker's contribution."""
    world = len(compressors)
    into = list(shares) if shares is not None else [None] * world
    gens = [c.exchange(g, world, None, s) for c, g, s in zip(compressors, grads, into, strict=True)]
    messages: list[Any] = [next(g) for g in gens]
    totals = [0] * world
    results: list[torch.Tensor | None] = [None] * world
    while any(r is None for r in results):
        for i, m in enumerate(messages):
            totals[i] += _nbytes(m)
        if compressors[0].collective == "all-reduce":
            combined: Any = messages[0].clone()
            for m in messages[1:]:
                combined.add_(m)
        else:
            combined = list(messages)
        for i, gen in enumerate(gens):
            try:
                messages[i] = gen.send(combined.clone() if isinstance(combined, torch.Tensor)
                                       else combined)
            except StopIteration as stop:
                results[i] = stop.value
        assert all(r is None for r in results) or all(r is not None for r in results)
    if sent is not None:
        sent[:] = totals
    return [r for r in results if r is not None]
