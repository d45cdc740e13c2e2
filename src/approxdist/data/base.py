"""An in-memory data set: train/test tensors, normalisation and the augmentation to use."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TensorDataset:
    """Inputs (images as float32 (N, C, H, W) normalised per channel, or token ids as int64
    (N, T)) and int64 labels, (N,) for classes or (N, T) for next tokens (`task`)."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    #: "none" or "crop-flip" (random crop with 4-pixel padding + horizontal flip)
    augmentation: str = "none"
    #: how outputs meet labels, a name in `train.task.TASKS`: "classify" or "next-token"
    task: str = "classify"

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])

    def __post_init__(self) -> None:
        assert self.train_x.shape[0] == self.train_y.shape[0]
        assert self.test_x.shape[0] == self.test_y.shape[0]


def normalise(train: torch.Tensor, test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel standardisation with the training set's statistics."""
    dims = [0] + list(range(2, train.dim()))
    mean = train.mean(dim=dims, keepdim=True)
    std = train.std(dim=dims, keepdim=True).clamp_min(1e-6)
    return ((train - mean) / std).contiguous(), ((test - mean) / std).contiguous()


def fixed_split(n: int, test_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A train/test index split that depends only on `n` and `seed`."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test = int(round(n * test_fraction))
    return perm[n_test:].sort().values, perm[:n_test].sort().values
