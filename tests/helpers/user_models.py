"""Model factories as a user would write them (imported by name in the own-model tests)."""

from __future__ import annotations

import math

from torch import nn


def small_mlp(input_shape: tuple[int, ...], classes: int, hidden: int = 8) -> nn.Sequential:
    """Two blocks: flatten + hidden layer, classifier."""
    return nn.Sequential(nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), hidden),
                                       nn.ReLU()),
                         nn.Linear(hidden, classes))


def as_list(hidden: int = 4) -> list[nn.Module]:
    return [nn.Flatten(), nn.Linear(16, hidden)]


def not_blocks() -> nn.Module:
    return nn.Linear(4, 2)


NOT_A_FUNCTION = 3


def tiny_gpt(input_shape: tuple[int, ...], classes: int) -> nn.Sequential:
    """A 1-layer GPT block sequence (embedding, transformer block, head) for token tests."""
    from approxdist.models.gpt import GPTSize, gpt

    return gpt(GPTSize(dim=16, layers=1, heads=2), classes, input_shape[0])
