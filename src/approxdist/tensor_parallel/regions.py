"""Communication as autograd regions (Megatron-LM's `mappings.py`), on the `tp` group.

- `copy_to(x)`: identity forward; the input gradients all-reduced backward (on the `tp_bwd`
  wire) — where a column-parallel layer takes a replicated input;
- `reduce_from(x)`: partial sums all-reduced forward (on the `tp_fwd` wire); identity
  backward — where a row-parallel layer's partial outputs become the full output.

A column-parallel layer followed by a row-parallel one needs one all-reduce forward and
one backward and none between them. Each call names its *site* (the layer's path), under
which a wire with error feedback keeps that site's residual.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from approxdist.tensor_parallel.comm import TPComm


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TPComm, site: str) -> torch.Tensor:
        ctx.comm, ctx.site = comm, site
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        return ctx.comm.all_reduce(grad, "bwd", ctx.site), None, None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: TPComm, site: str) -> torch.Tensor:
        return comm.all_reduce(x, "fwd", site)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        return grad, None, None


def copy_to(x: torch.Tensor, comm: TPComm, site: str) -> torch.Tensor:
    """`x` unchanged forward; its gradient summed over the tp ranks backward."""
    return _CopyTo.apply(x, comm, site)


def reduce_from(x: torch.Tensor, comm: TPComm, site: str) -> torch.Tensor:
    """`x` summed over the tp ranks forward; the gradient unchanged backward."""
    return _ReduceFrom.apply(x, comm, site)
