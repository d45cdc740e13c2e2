"""A data set from one NumPy `.npz` file: arrays `x_train`, `y_train` and optionally
`x_test`, `y_test`.

- `y` of shape (N,), integers 0..C-1: classification; `x` (N, ...) is used as float32,
  as given (standardise it beforehand if it needs it).
- `x` and `y` both integer of shape (N, T): next-token prediction on token ids (e.g.
  `y` is `x` shifted by one); the vocabulary is the largest id + 1.

Without `x_test` / `y_test`, 20 % of the samples, chosen by a fixed seed, are the test set.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch

from approxdist.data.base import TensorDataset, fixed_split
from approxdist.errors import DataError

REQUIRED = ("x_train", "y_train")
OPTIONAL = ("x_test", "y_test")
SPLIT_SEED = 1234


def read_npz(path: str) -> dict[str, np.ndarray]:
    file = Path(path)
    if not file.is_file():
        raise DataError(f".npz file {path!r} does not exist; pass --data-dir FILE.npz")
    try:
        with np.load(file, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise DataError(f"{path!r} is not a NumPy .npz file ({exc}); write it with "
                        f"numpy.savez(path, x_train=..., y_train=...)") from None
    missing = [n for n in REQUIRED if n not in arrays]
    tests = [n for n in OPTIONAL if n in arrays]
    if missing or len(tests) == 1:
        need = missing or [n for n in OPTIONAL if n not in arrays]
        raise DataError(f".npz file {path!r} lacks the array(s) {', '.join(need)} (it has "
                        f"{', '.join(sorted(arrays)) or 'none'}); save x_train and y_train, "
                        f"and x_test with y_test or neither")
    return arrays


def _check(path: str, x: np.ndarray, y: np.ndarray, split: str) -> None:
    if len(x) != len(y) or len(x) == 0:
        raise DataError(f".npz file {path!r}: x_{split} has {len(x)} samples, y_{split} "
                        f"{len(y)}; give both the same, non-zero number of samples")
    if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
        raise DataError(f".npz file {path!r}: y_{split} must hold class indices or token ids "
                        f"(integers >= 0), got dtype {y.dtype}")


def load_npz(path: str) -> TensorDataset:
    arrays = read_npz(path)
    x, y = arrays["x_train"], arrays["y_train"]
    _check(path, x, y, "train")
    if "x_test" in arrays:
        ex, ey = arrays["x_test"], arrays["y_test"]
        _check(path, ex, ey, "test")
    else:
        train_idx, test_idx = fixed_split(len(y), 0.2, SPLIT_SEED)
        x, ex = x[train_idx.numpy()], x[test_idx.numpy()]
        y, ey = y[train_idx.numpy()], y[test_idx.numpy()]
    tokens = y.ndim == 2 and x.shape == y.shape and np.issubdtype(x.dtype, np.integer)
    if not tokens and y.ndim != 1:
        raise DataError(f".npz file {path!r}: y_train has shape {list(y.shape)}; give one "
                        f"class per sample (N,), or token ids (N, T) next to x_train (N, T)")
    if tokens:
        vocab = int(max(x.max(), y.max(), ex.max(), ey.max())) + 1
        return TensorDataset("npz", torch.from_numpy(x.astype(np.int64)),
                             torch.from_numpy(y.astype(np.int64)),
                             torch.from_numpy(ex.astype(np.int64)),
                             torch.from_numpy(ey.astype(np.int64)), vocab, task="next-token")
    classes = int(max(y.max(), ey.max())) + 1
    return TensorDataset("npz", torch.from_numpy(x.astype(np.float32)),
                         torch.from_numpy(y.astype(np.int64)),
                         torch.from_numpy(ex.astype(np.float32)),
                         torch.from_numpy(ey.astype(np.int64)), classes)
