"""MNIST-1D (Greydanus 2020): 1-D signals of the ten digits, generated locally, no download.

`mnist1d.data.make_dataset` builds the data set from ten hand-made templates with
random padding, translation, scaling, shear and correlated noise, so it is real
procedurally generated data that ships with the package. It is much harder than the
8x8 digits for small models (an MLP stays near 60-70 %, small CNNs reach 90+ % only
with enough training), which is why the precision experiments use it: lossy wire
formats separate from fp32 there, while on digits every codec saturates.
Samples: 4000 train / 1000 test of length 40 (the package's defaults), seed fixed.
"""

from __future__ import annotations

import torch

from approxdist.data.base import TensorDataset, normalise
from approxdist.errors import DataError

#: the package's default generation seed; the data set is the same on every machine
SEED = 42


def load_mnist1d(num_samples: int = 5000) -> TensorDataset:
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError:
        raise DataError("data set 'mnist1d' needs the mnist1d package: pip install mnist1d") from None
    args = get_dataset_args()
    args.num_samples = num_samples
    args.seed = SEED
    raw = make_dataset(args)
    train_x = torch.tensor(raw["x"], dtype=torch.float32).unsqueeze(1)
    test_x = torch.tensor(raw["x_test"], dtype=torch.float32).unsqueeze(1)
    train_x, test_x = normalise(train_x, test_x)
    train_y = torch.tensor(raw["y"], dtype=torch.int64)
    test_y = torch.tensor(raw["y_test"], dtype=torch.int64)
    return TensorDataset("mnist1d", train_x, train_y, test_x, test_y, 10, "none")
