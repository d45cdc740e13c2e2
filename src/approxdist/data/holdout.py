"""A validation split held out of the *training* set (AdaPrec's signal; never the test set)."""

from __future__ import annotations

import dataclasses

import torch

from approxdist.data.base import TensorDataset
from approxdist.data.loader import mix_seed
from approxdist.errors import DataError


def hold_out(data: TensorDataset, fraction: float, seed: int, world: int,
             global_batch: int) -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    """(the data set without the split, validation inputs, labels): a `fraction` of the
    training samples chosen by `seed`, at least one per rank, leaving one global batch."""
    n = data.train_x.shape[0]
    n_val = int(round(n * fraction))
    if n_val < world:
        need = (world + 0.5) / n
        raise DataError(f"adaprec.val_fraction = {fraction} holds out {n_val} of the {n} "
                        f"training samples, fewer than one per rank ({world}); use "
                        f"--set adaprec.val_fraction={min(0.5, need):.3g} or more")
    if n - n_val < global_batch:
        raise DataError(f"adaprec.val_fraction = {fraction} leaves {n - n_val} training samples, "
                        f"fewer than one batch ({global_batch}); lower the fraction or "
                        f"--batch-size")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(mix_seed(seed, 4004)))
    val, keep = perm[:n_val].sort().values, perm[n_val:].sort().values
    rest = dataclasses.replace(data, train_x=data.train_x[keep], train_y=data.train_y[keep])
    return rest, data.train_x[val], data.train_y[val]
