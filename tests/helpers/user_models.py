"""Model factories as a user would write them (imported by name in the own-model tests)."""

from __future__ import annotations

import math

import torch
from torch import nn


def small_mlp(input_shape: tuple[int, ...], classes: int, hidden: int = 8) -> nn.Sequential:
    """Two blocks: flatten + hidden layer, classifier."""
    return nn.Sequential(nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), hidden),
                                       nn.ReLU()),
                         nn.Linear(hidden, classes))


def nudged_mlp(input_shape: tuple[int, ...], classes: int) -> nn.Sequential:
    """`--model mlp` (its default sizes, the weights the run's seed gives) with every weight
    one ulp up (`torch.nextafter`): the same run one rounding away, the twin whose distance
    `tests/gpu/test_cuda_train.py` measures."""
    from approxdist.models.mlp import mlp

    model = mlp(input_shape, classes)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.nextafter(p, torch.full_like(p, math.inf)))
    return model


def as_list(hidden: int = 4) -> list[nn.Module]:
    return [nn.Flatten(), nn.Linear(16, hidden)]


def not_blocks() -> nn.Module:
    return nn.Linear(4, 2)


NOT_A_FUNCTION = 3


def tiny_gpt(input_shape: tuple[int, ...], classes: int) -> nn.Sequential:
    """A 1-layer GPT block sequence (embedding, transformer block, head) for token tests."""
    from approxdist.models.gpt import GPTSize, gpt

    return gpt(GPTSize(dim=16, layers=1, heads=2), classes, input_shape[0])


class _Accumulating(torch.autograd.Function):
    """x * w whose backward writes w's gradient itself (a backward that cannot be split)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        ctx.w = w
        return x * w.detach()

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        step = (g * x).sum(0)
        ctx.w.grad = step if ctx.w.grad is None else ctx.w.grad + step
        return g * ctx.w.detach(), None


class Scale(nn.Module):
    """A user's block whose backward accumulates into its weight's `.grad` itself."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Accumulating.apply(x, self.w)


class _Square(torch.autograd.Function):
    """x * x by hand: a custom function whose backward returns the input gradient only."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        return 2 * x * g


class Square(nn.Module):
    """A parameter-free block of a user's own (a split backward has nothing to defer)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Square.apply(x)


def with_middle(input_shape: tuple[int, ...], classes: int, middle: nn.Module
                ) -> nn.Sequential:
    """Six blocks with `middle` third (block 2), batch norm and dropout after it."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 8), middle,
                         nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, classes))


def unsplittable(input_shape: tuple[int, ...], classes: int) -> nn.Sequential:
    """Block 2 writes its weight's gradient in its backward: zero-bubble schedules refuse it."""
    return with_middle(input_shape, classes, Scale(8))


def parameter_free(input_shape: tuple[int, ...], classes: int) -> nn.Sequential:
    """Block 2 is a parameter-free custom function: every schedule runs it."""
    return with_middle(input_shape, classes, Square())
