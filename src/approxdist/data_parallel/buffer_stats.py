"""Batch-norm statistics across replicas: a module's floating-point buffers averaged in one message.

Gradients are averaged every step; buffers (running means and variances) are not part
of the gradient, so each replica's drift apart until they are averaged too, at the end
of an epoch before evaluation. Data parallelism (`PlainAllReduce`, `DataParallel`) and
the parameter server's workers do it alike: every float buffer in one flat vector, one
reduction, each buffer written back in place. Only the reduction differs, so it is the
caller's `mean`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def average_float_buffers(module: nn.Module, mean: Callable[[torch.Tensor], torch.Tensor],
                          dtype: torch.dtype | None = None) -> None:
    """Set every floating-point buffer of `module` to its mean over the replicas.

    `mean` gets the buffers, in `module.buffers()` order, as one flat vector of `dtype`
    (None: their own) and returns the vector averaged over the replicas (it may reduce in
    place and return its argument); each buffer then takes its slice, cast back to its
    dtype. A module without floating-point buffers calls no `mean`."""
    bufs = [b for b in module.buffers() if b.is_floating_point()]
    if not bufs:
        return
    flat = torch.cat([b.detach().reshape(-1).to(dtype or b.dtype) for b in bufs])
    averaged = mean(flat)
    at = 0
    for b in bufs:
        b.copy_(averaged[at:at + b.numel()].view_as(b))
        at += b.numel()
