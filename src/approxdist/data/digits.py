"""scikit-learn's bundled handwritten digits (8x8, 10 classes, 1797 images): real data, no download.

Importing scikit-learn costs a rank about a second of CPU, so the images are stored once
per machine (`data/stored.py`, keyed by scikit-learn's version) and read from there.
"""

from __future__ import annotations

import torch

from approxdist.data.base import TensorDataset, fixed_split, normalise
from approxdist.data.stored import package_version, stored

#: the split is fixed: 20 % test, chosen by this seed, identical on every machine
SPLIT_SEED = 1234


def load_digits_dataset() -> TensorDataset:
    version = package_version("scikit-learn", "digits")
    raw = stored(f"digits-sklearn{version}", ("x", "y"), _images)
    x, y = raw["x"], raw["y"]
    train_idx, test_idx = fixed_split(len(y), 0.2, SPLIT_SEED)
    train_x, test_x = normalise(x[train_idx], x[test_idx])
    return TensorDataset("digits", train_x, y[train_idx], test_x, y[test_idx], 10, "none")


def _images() -> dict[str, torch.Tensor]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return {"x": torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0,
            "y": torch.tensor(bunch.target, dtype=torch.int64)}
