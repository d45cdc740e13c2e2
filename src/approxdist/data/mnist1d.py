"""MNIST-1D (Greydanus 2020): 1-D signals of the ten digits, generated locally, no download.

`mnist1d.data.make_dataset` builds the data set from ten hand-made templates with
random padding, translation, scaling, shear and correlated noise, so it is real
procedurally generated data that ships with the package. It is much harder than the
8x8 digits for small models (an MLP stays near 60-70 %, small CNNs reach 90+ % only
with enough training), which is why the precision experiments use it: lossy wire
formats separate from fp32 there, while on digits every codec saturates.
Samples: 4000 train / 1000 test of length 40 (the package's defaults), seed fixed.
Generating takes seconds of CPU, so the result is stored once per machine
(`data/stored.py`), keyed by the sample count, the seed and the package's version.
"""

from __future__ import annotations

import torch

from approxdist.data.base import TensorDataset, normalise
from approxdist.data.stored import package_version, stored

#: the package's default generation seed; the data set is the same on every machine
SEED = 42
KEYS = ("train_x", "train_y", "test_x", "test_y")


def load_mnist1d(num_samples: int = 5000) -> TensorDataset:
    version = package_version("mnist1d", "mnist1d")
    raw = stored(f"mnist1d-{version}-n{num_samples}-seed{SEED}", KEYS,
                 lambda: _generate(num_samples))
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
