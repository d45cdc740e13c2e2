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


def check_bundle_steps(bundles: Sequence[Compressor],
                       alone: Sequence[Sequence[Compressor | None]],
                       shapes: Sequence[tuple[int, ...]], steps: int, seed: int) -> None:
    """`steps` exchanges of one bundle a worker (`Together`, `GatheredTogether`) over random
    gradients equal, bit for bit, each member's own exchange (`alone[w][i]`: worker w's
    compressor of tensor i, None: exact, the worker-order mean); so does what each member
    contributes (AdaPrec's `sent`); each worker's message holds the bundle's `wire_bytes()`."""
    world, gen = len(bundles), torch.Generator().manual_seed(seed)
    for _ in range(steps):
        grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(world)]
        sent = [0] * world
        shares = [torch.full((bundles[0].numel,), float("nan")) for _ in range(world)]
        got = lockstep(bundles, [torch.cat([g.reshape(-1) for g in gs]) for gs in grads],
                       sent, shares)
        at = 0
        for i, shape in enumerate(shapes):
            n = torch.Size(shape).numel()
            own = [grads[w][i] for w in range(world)]
            comps = [alone[w][i] for w in range(world)]
            mine = [torch.empty(n) for _ in range(world)]
            want = lockstep([c for c in comps if c is not None], own, shares=mine) \
                if comps[0] is not None else [sum(own[1:], own[0].clone()).div_(world)] * world
            for w in range(world):
                assert torch.equal(got[w][at:at + n].view(shape), want[w]), (i, w)
                share = mine[w] if comps[0] is not None else own[w].reshape(-1)
                assert torch.equal(shares[w][at:at + n], share), (i, w)
            at += n
        assert sent == [bundles[0].wire_bytes()] * world
