"""MNIST from a local directory of IDX files (optionally gzipped), as published by LeCun et al."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch

from approxdist.data.base import TensorDataset, normalise
from approxdist.errors import DataError

FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}


def _open(root: Path, stem: str) -> bytes:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx")):
        path = root / name
        if path.is_file():
            return gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes()
    raise DataError(f"MNIST file {stem}[.gz] not found in {str(root)!r}; pass the IDX directory")


def parse_idx(raw: bytes, where: str) -> np.ndarray:
    """Decode an IDX file: magic (0, 0, type 0x08=uint8, ndim), big-endian dims, data."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{where} is not an unsigned-byte IDX file (bad magic {raw[:4]!r})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    count = int(np.prod(dims)) if dims else 0
    if len(raw) != header + count:
        raise DataError(f"{where} is truncated: {len(raw) - header} bytes for dims {dims}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def load_mnist(root: str) -> TensorDataset:
    base = Path(root)
    if not base.is_dir():
        raise DataError(f"MNIST directory {root!r} does not exist; pass --data-dir PATH")
    arrays = {k: parse_idx(_open(base, stem), stem) for k, stem in FILES.items()}
    train_x = torch.from_numpy(arrays["train_x"].copy()).float().unsqueeze(1) / 255.0
    test_x = torch.from_numpy(arrays["test_x"].copy()).float().unsqueeze(1) / 255.0
    tx, ex = normalise(train_x, test_x)
    ty = torch.from_numpy(arrays["train_y"].astype(np.int64))
    ey = torch.from_numpy(arrays["test_y"].astype(np.int64))
    return TensorDataset("mnist", tx, ty, ex, ey, 10, "none")
