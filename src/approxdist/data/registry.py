"""Data sets by name; an unknown name lists the valid ones."""

from __future__ import annotations

from collections.abc import Callable

from approxdist.config.schema import DataConfig
from approxdist.data.arrays import load_npz
from approxdist.data.base import TensorDataset
from approxdist.data.cifar import load_cifar10
from approxdist.data.digits import load_digits_dataset
from approxdist.data.folder import load_image_folder
from approxdist.data.mnist import load_mnist
from approxdist.data.mnist1d import load_mnist1d
from approxdist.data.synthetic import make_synthetic
from approxdist.data.text import load_stdlib_text
from approxdist.errors import DataError
from approxdist.registry import Registry

DATASETS: Registry[Callable[[DataConfig], TensorDataset]] = Registry("data set", DataError)


def _needs_dir(cfg: DataConfig, name: str) -> str:
    if not cfg.data_dir:
        raise DataError(f"data set {name!r} loads from a local path; pass --data-dir PATH")
    return cfg.data_dir


DATASETS.add("digits", lambda cfg: load_digits_dataset())
DATASETS.add("cifar10", lambda cfg: load_cifar10(_needs_dir(cfg, "cifar10")))
DATASETS.add("mnist", lambda cfg: load_mnist(_needs_dir(cfg, "mnist")))
DATASETS.add("mnist1d", lambda cfg: load_mnist1d())
DATASETS.add(
    "synthetic",
    lambda cfg: make_synthetic(cfg.synthetic_shape, cfg.synthetic_classes, cfg.synthetic_samples),
)
DATASETS.add("imagefolder", lambda cfg: load_image_folder(_needs_dir(cfg, "imagefolder")))
DATASETS.add("npz", lambda cfg: load_npz(_needs_dir(cfg, "npz")))
DATASETS.add("stdlib-text", lambda cfg: load_stdlib_text(cfg.seq_len))


def load_dataset(cfg: DataConfig) -> TensorDataset:
    return DATASETS.get(cfg.dataset)(cfg)
