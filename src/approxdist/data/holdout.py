"""AdaPrec's signal set, drawn from the *training* set (never the test set).

Held out of training where the signal must predict accuracy on unseen data (the curve
rule, seed 004's: its learning-curve model extrapolates it), or a sample that stays in
training where the signal only guards against a codec that damages training (the error
rule's collapse and falling checks, which a drop of the fit on training samples shows as
well): holding out 10 % of MNIST-1D's 4000 training samples cost 3.5 points of test
accuracy in seed 004's preset (docs/adaprec.md), far more than the codecs' differences.
"""

from __future__ import annotations

import dataclasses

import torch

from approxdist.data.base import TensorDataset
from approxdist.data.loader import mix_seed
from approxdist.errors import DataError


def hold_out(data: TensorDataset, fraction: float, seed: int, world: int,
             global_batch: int, remove: bool = True
             ) -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    """(the data set to train on, the signal's inputs, labels): a `fraction` of the
    training samples chosen by `seed`, at least one per rank; with `remove` they leave the
    training set (at least one global batch must stay), else it is returned whole."""
    n = data.train_x.shape[0]
    n_val = int(round(n * fraction))
    if n_val < world:
        need = (world + 0.5) / n
        raise DataError(f"adaprec.val_fraction = {fraction} holds out {n_val} of the {n} "
                        f"training samples, fewer than one per rank ({world}); use "
                        f"--set adaprec.val_fraction={min(0.5, need):.3g} or more")
    if remove and n - n_val < global_batch:
        raise DataError(f"adaprec.val_fraction = {fraction} leaves {n - n_val} training samples, "
                        f"fewer than one batch ({global_batch}); lower the fraction or "
                        f"--batch-size")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(mix_seed(seed, 4004)))
    val, keep = perm[:n_val].sort().values, perm[n_val:].sort().values
    if not remove:
        return data, data.train_x[val], data.train_y[val]
    rest = dataclasses.replace(data, train_x=data.train_x[keep], train_y=data.train_y[keep])
    return rest, data.train_x[val], data.train_y[val]
