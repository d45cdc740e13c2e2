"""Deterministic, sharded mini-batches: every rank draws its slice of the same global batch.

For epoch e the global order is a permutation seeded by (seed, e), identical on all ranks.
Global batch k is `order[k*B:(k+1)*B]`; rank r of W takes the r-th contiguous slice of
B/W samples. So W ranks together see exactly the batches a single process with batch B
sees, ranks never share a sample, and the same seed gives the same run. The last,
incomplete global batch of an epoch is dropped (a different one each epoch). Random
augmentation is drawn for the whole global batch from a generator seeded by
(seed, e, k), then sliced, so it too is independent of the world size.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from approxdist.data.base import TensorDataset
from approxdist.errors import DataError

PAD = 4


def mix_seed(*values: int) -> int:
    """A deterministic 63-bit seed from integers (no Python hash randomisation)."""
    acc = 0x9E3779B97F4A7C15
    for v in values:
        acc = (acc ^ (v & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
    return acc >> 1


def draw_crop_flip(n: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Offsets and flips for a random crop with 4-pixel padding and a random horizontal flip."""
    dy = torch.randint(0, 2 * PAD + 1, (n,), generator=gen)
    dx = torch.randint(0, 2 * PAD + 1, (n,), generator=gen)
    flip = torch.rand(n, generator=gen) < 0.5
    return dy, dx, flip


def apply_crop_flip(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor,
                    flip: torch.Tensor) -> torch.Tensor:
    """The CIFAR-standard augmentation, with offsets drawn by `draw_crop_flip`."""
    padded = torch.nn.functional.pad(x, (PAD, PAD, PAD, PAD))
    h, w = x.shape[-2:]
    out = torch.empty_like(x)
    for i in range(x.shape[0]):
        y0, x0 = int(dy[i]), int(dx[i])
        patch = padded[i, :, y0:y0 + h, x0:x0 + w]
        out[i] = patch.flip(-1) if bool(flip[i]) else patch
    return out


class ShardedBatches:
    """Training batches of one rank; see the module docstring for the exact contract."""

    def __init__(self, data: TensorDataset, global_batch: int, rank: int, world: int,
                 seed: int, augment: bool = True) -> None:
        n = data.train_x.shape[0]
        if global_batch % world:
            raise DataError(f"batch size {global_batch} is not divisible by world size {world}")
        if global_batch > n:
            raise DataError(
                f"batch size {global_batch} is larger than the training set ({n} samples); "
                f"use --batch-size {max(world, n // 4 // world * world)} or smaller"
            )
        self.data = data
        self.global_batch = global_batch
        self.rank = rank
        self.world = world
        self.seed = seed
        self.augment = augment and data.augmentation == "crop-flip"
        self.local_batch = global_batch // world

    def resized(self, global_batch: int) -> ShardedBatches:
        """The same shards with another global batch (a growing batch, one per epoch)."""
        if global_batch == self.global_batch:
            return self
        return ShardedBatches(self.data, global_batch, self.rank, self.world, self.seed,
                              self.augment)

    @property
    def steps_per_epoch(self) -> int:
        return self.data.train_x.shape[0] // self.global_batch

    def order(self, epoch: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(mix_seed(self.seed, epoch))
        return torch.randperm(self.data.train_x.shape[0], generator=gen)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's batches of `epoch`, from batch `start` on (a run resumed mid-epoch
        draws exactly what it would have drawn)."""
        order = self.order(epoch)
        lo = self.rank * self.local_batch
        for step in range(start, self.steps_per_epoch):
            idx = order[step * self.global_batch: (step + 1) * self.global_batch]
            mine = idx[lo: lo + self.local_batch]
            x, y = self.data.train_x[mine], self.data.train_y[mine]
            if self.augment:
                gen = torch.Generator().manual_seed(mix_seed(self.seed, epoch, step, 7))
                dy, dx, flip = draw_crop_flip(len(idx), gen)
                sl = slice(lo, lo + self.local_batch)
                x = apply_crop_flip(x, dy[sl], dx[sl], flip[sl])
            yield x, y


def eval_shard(data: TensorDataset, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's contiguous share of the test set (shares differ by at most one sample)."""
    return eval_shard_of(data.test_x, data.test_y, rank, world)


def eval_shard_of(x: torch.Tensor, y: torch.Tensor, rank: int,
                  world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's contiguous share of (x, y) (shares differ by at most one sample)."""
    n = x.shape[0]
    lo, hi = n * rank // world, n * (rank + 1) // world
    return x[lo:hi], y[lo:hi]
