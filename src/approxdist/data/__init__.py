"""Data sets (digits by default, CIFAR-10, MNIST, MNIST-1D, stdlib text, image folders, .npz,
synthetic) and deterministic sharded batches."""

from approxdist.data.base import TensorDataset
from approxdist.data.loader import ShardedBatches
from approxdist.data.registry import DATASETS, load_dataset

__all__ = ["DATASETS", "ShardedBatches", "TensorDataset", "load_dataset"]
