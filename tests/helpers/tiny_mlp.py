"""A tiny MLP, its per-rank batches and an SGD loop: what the data-parallel state tests share."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812


def net() -> nn.Sequential:
    """The same 10-32-4 MLP on every call (seed 0)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s 8 samples of step `step`."""
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(8, 10, generator=g), torch.randint(0, 4, (8,), generator=g)


def sgd_steps(dp: nn.Module, opt: torch.optim.Optimizer, rank: int, steps: range) -> None:
    """Cross-entropy steps of `dp` on rank `rank`'s batches."""
    for s in steps:
        x, y = batch(rank, s)
        opt.zero_grad()
        F.cross_entropy(dp(x), y).backward()
        opt.step()
