"""CIFAR-10 from a local directory in the standard python pickle format (cifar-10-batches-py)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from approxdist.data.base import TensorDataset, normalise
from approxdist.errors import DataError

TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"


def find_cifar_dir(root: str) -> Path:
    """`root` itself or its `cifar-10-batches-py` child, whichever holds the batch files."""
    base = Path(root)
    if not base.is_dir():
        raise DataError(f"CIFAR-10 directory {root!r} does not exist; pass --data-dir PATH")
    for cand in (base, base / "cifar-10-batches-py"):
        if (cand / TRAIN_FILES[0]).is_file():
            return cand
    raise DataError(
        f"{root!r} is not a CIFAR-10 python directory: no {TRAIN_FILES[0]} in it or in "
        "cifar-10-batches-py/; unpack cifar-10-python.tar.gz (the python version) there"
    )


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise DataError(f"CIFAR-10 file {str(path)!r} is missing; the directory is incomplete")
    try:
        with path.open("rb") as fh:
            entry = pickle.load(fh, encoding="bytes")
        data = np.asarray(entry[b"data"], dtype=np.uint8)
        labels = np.asarray(entry.get(b"labels", entry.get(b"fine_labels")), dtype=np.int64)
    except Exception as exc:  # noqa: BLE001 - any malformed file becomes one clear error
        raise DataError(
            f"CIFAR-10 file {str(path)!r} is not a python-format batch ({exc}); "
            "use the python version of CIFAR-10, not the binary or MATLAB one"
        ) from None
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != data.shape[0]:
        raise DataError(
            f"CIFAR-10 file {str(path)!r} has data of shape {data.shape}; expected (N, 3072)"
        )
    return data.reshape(-1, 3, 32, 32), labels


def load_cifar10(root: str) -> TensorDataset:
    base = find_cifar_dir(root)
    parts = [_read_batch(base / name) for name in TRAIN_FILES if (base / name).is_file()]
    if len(parts) != len(TRAIN_FILES):
        missing = [n for n in TRAIN_FILES if not (base / n).is_file()]
        raise DataError(f"CIFAR-10 directory {str(base)!r} lacks {', '.join(missing)}")
    test_x, test_y = _read_batch(base / TEST_FILE)
    train_x = torch.from_numpy(np.concatenate([p[0] for p in parts])).float() / 255.0
    train_y = torch.from_numpy(np.concatenate([p[1] for p in parts]))
    tx, ex = normalise(train_x, torch.from_numpy(test_x).float() / 255.0)
    return TensorDataset("cifar10", tx, train_y, ex, torch.from_numpy(test_y), 10, "crop-flip")
