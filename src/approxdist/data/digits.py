"""scikit-learn's bundled handwritten digits (8x8, 10 classes, 1797 images): real data, no download."""

from __future__ import annotations

import torch

from approxdist.data.base import TensorDataset, fixed_split, normalise

#: the split is fixed: 20 % test, chosen by this seed, identical on every machine
SPLIT_SEED = 1234


def load_digits_dataset() -> TensorDataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.int64)
    train_idx, test_idx = fixed_split(len(y), 0.2, SPLIT_SEED)
    train_x, test_x = normalise(x[train_idx], x[test_idx])
    return TensorDataset("digits", train_x, y[train_idx], test_x, y[test_idx], 10, "none")
