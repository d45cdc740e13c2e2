"""Sequence parallelism's autograd regions (Korthikanti et al. 2022; Megatron-LM's `mappings.py`).

Between the tensor-parallel layers of a transformer, activations (batch, sequence,
features) are split along the sequence (`SEQ_DIM`) over the `tp` ranks, so the norms,
dropout and residual adds run on 1/n of the positions. The regions move between that
split and the layers that need every position; each collective is the link layer's
(`TPComm`: forward on the `tp_fwd` wire, backward on `tp_bwd`):

- `scatter_to_sequence` (entering the region): this rank's positions forward; backward,
  the gradient all-gathered;
- `gather_from_sequence` (before a column-parallel layer, and leaving the region):
  all-gather forward; backward, the gradient reduce-scattered (`partial_grad`: a
  column-parallel layer's input gradients are partial sums) or this rank's positions
  kept (a whole layer follows: the gradient is the same on every rank);
- `reduce_scatter_to_sequence` (a row-parallel layer's partial outputs): reduce-scatter
  forward, all-gather backward.

A sequence length the tp size does not divide is refused (`ConfigError`, one line).
Dropout inside the region (`SequenceDropout`) draws the mask of every position and keeps
this rank's: the masks one process draws, not a per-rank stream (Megatron-LM forks one
per rank, whose masks no single process reproduces), so the split model equals the whole
one with dropout on, at the cost of drawing n times the positions it applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from approxdist.errors import ConfigError
from approxdist.tensor_parallel.shard import piece

if TYPE_CHECKING:
    from approxdist.tensor_parallel.comm import TPComm

#: the sequence dimension of (batch, sequence, features) activations
SEQ_DIM = 1


def _mine(x: torch.Tensor, comm: TPComm, site: str) -> torch.Tensor:
    """This rank's positions of `x` (a view)."""
    if x.dim() <= SEQ_DIM:
        raise ConfigError(f"sequence parallelism at {site!r} needs (batch, sequence, ...) "
                          f"activations, got shape {tuple(x.shape)}; split the sequence only "
                          f"where a model's activations have one")
    part = piece(x.shape[SEQ_DIM], comm.rank, comm.size, f"sequence positions at {site}")
    return x.narrow(SEQ_DIM, part.start, part.stop - part.start)


class _Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TPComm, site: str) -> torch.Tensor:
        ctx.comm, ctx.site = comm, site
        return _mine(x, comm, site).clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        return ctx.comm.all_gather(grad, SEQ_DIM, "bwd", ctx.site), None, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TPComm, site: str,
                partial_grad: bool) -> torch.Tensor:
        ctx.comm, ctx.site, ctx.partial = comm, site, partial_grad
        return comm.all_gather(x, SEQ_DIM, "fwd", site)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        if ctx.partial:
            return ctx.comm.reduce_scatter(grad, SEQ_DIM, "bwd", ctx.site), None, None, None
        return _mine(grad, ctx.comm, ctx.site).clone(), None, None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TPComm, site: str) -> torch.Tensor:
        ctx.comm, ctx.site = comm, site
        return comm.reduce_scatter(x, SEQ_DIM, "fwd", site)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        return ctx.comm.all_gather(grad, SEQ_DIM, "bwd", ctx.site), None, None


def scatter_to_sequence(x: torch.Tensor, comm: TPComm, site: str) -> torch.Tensor:
    """This rank's positions of the whole `x`; the gradients of all positions gathered
    backward."""
    if comm.size == 1:
        return x
    return _Scatter.apply(x, comm, site)


def gather_from_sequence(x: torch.Tensor, comm: TPComm, site: str, *,
                         partial_grad: bool) -> torch.Tensor:
    """Every rank's positions, in order. Backward, `partial_grad` (a column-parallel layer
    follows: each rank's input gradient is a partial sum) reduce-scatters the gradient;
    otherwise (a whole layer follows: the gradient is the same on every rank) each rank
    keeps its positions'."""
    if comm.size == 1:
        return x
    return _Gather.apply(x, comm, site, partial_grad)


def reduce_scatter_to_sequence(x: torch.Tensor, comm: TPComm, site: str) -> torch.Tensor:
    """This rank's positions of the sum of every rank's `x`; the gradient gathered backward."""
    if comm.size == 1:
        return x
    return _ReduceScatter.apply(x, comm, site)


class SequenceDropout(nn.Module):
    """`nn.Dropout(p)` on this rank's positions of (batch, sequence, ...) activations: the
    mask drawn for every rank's positions (the default generator, as `nn.Dropout` draws
    on the whole tensor; the same on every `tp` rank) and this rank's part applied."""

    def __init__(self, p: float, comm: TPComm, site: str) -> None:
        super().__init__()
        self.p, self.comm, self.site = p, comm, site

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not self.p:
            return x
        whole = list(x.shape)
        whole[SEQ_DIM] *= self.comm.size  # the sequence length, which `_mine` checks divides
        keep = torch.empty(whole, dtype=x.dtype, device=x.device).bernoulli_(1 - self.p)
        return x * _mine(keep, self.comm, self.site).div_(1 - self.p)
