"""Synthetic images of any shape and class count, for throughput work (learnable, not real)."""

from __future__ import annotations

import torch

from approxdist.data.base import TensorDataset


def make_synthetic(shape: tuple[int, ...], classes: int, samples: int, seed: int = 0) -> TensorDataset:
    """Gaussian noise around one random prototype per class: learnable, deterministic."""
    gen = torch.Generator().manual_seed(seed)
    protos = torch.randn((classes, *shape), generator=gen)
    n_test = max(classes, samples // 5)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, classes, (n,), generator=gen)
        x = protos[y] + 2.0 * torch.randn((n, *shape), generator=gen)
        return x, y

    train_x, train_y = draw(samples)
    test_x, test_y = draw(n_test)
    return TensorDataset("synthetic", train_x, train_y, test_x, test_y, classes, "none")
