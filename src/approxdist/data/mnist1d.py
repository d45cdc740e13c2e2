"""MNIST-1D (Greydanus 2020): 1-D signals of the ten digits, generated locally, no download.

`mnist1d.data.make_dataset` builds the data set from ten hand-made templates with
random padding, translation, scaling, shear and correlated noise, so it is real
procedurally generated data that ships with the package. It is much harder than the
8x8 digits for small models (an MLP stays near 60-70 %, small CNNs reach 90+ % only
with enough training), which is why the precision experiments use it: lossy wire
formats separate from fp32 there, while on digits every codec saturates.
Samples: 4000 train / 1000 test of length 40 (the package's defaults), seed fixed.
Generating takes seconds of CPU, so the result is kept in the cache folder
(`approxdist.cache`, `data/`), keyed by the sample count, the seed and the package's
version; every rank of every later run reads it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import tempfile
from pathlib import Path

import torch

from approxdist.cache import cache_dir
from approxdist.data.base import TensorDataset, normalise
from approxdist.errors import DataError

#: the package's default generation seed; the data set is the same on every machine
SEED = 42


KEYS = ("train_x", "train_y", "test_x", "test_y")


def load_mnist1d(num_samples: int = 5000) -> TensorDataset:
    try:
        version = importlib.metadata.version("mnist1d")
    except importlib.metadata.PackageNotFoundError:
        raise DataError("data set 'mnist1d' needs the mnist1d package: pip install mnist1d") from None
    path = cache_dir() / "data" / f"mnist1d-{version}-n{num_samples}-seed{SEED}.pt"
    raw = _cached(path)
    if raw is None:
        raw = _generate(num_samples)
        _store(path, raw)
    train_x, test_x = normalise(raw["train_x"], raw["test_x"])
    return TensorDataset("mnist1d", train_x, raw["train_y"], test_x, raw["test_y"], 10, "none")


def _generate(num_samples: int) -> dict[str, torch.Tensor]:
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = num_samples
    args.seed = SEED
    raw = make_dataset(args)
    return {"train_x": torch.tensor(raw["x"], dtype=torch.float32).unsqueeze(1),
            "test_x": torch.tensor(raw["x_test"], dtype=torch.float32).unsqueeze(1),
            "train_y": torch.tensor(raw["y"], dtype=torch.int64),
            "test_y": torch.tensor(raw["y_test"], dtype=torch.int64)}


def _cached(path: Path) -> dict[str, torch.Tensor] | None:
    """The stored data set, or None when there is none or it cannot be read whole."""
    try:
        raw = torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - missing, cut or foreign: generate it again
        return None
    ok = isinstance(raw, dict) and all(isinstance(raw.get(k), torch.Tensor) for k in KEYS)
    return raw if ok else None


def _store(path: Path, raw: dict[str, torch.Tensor]) -> None:
    """Write atomically (ranks may generate at once); a cache that cannot be written is
    skipped: the data set is the same without it."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        try:
            torch.save(raw, tmp)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
