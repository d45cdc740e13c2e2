"""Data: digits split, CIFAR-10 and MNIST from files the tests write, synthetic, sharding."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from approxdist.config.schema import DataConfig
from approxdist.data import ShardedBatches, load_dataset
from approxdist.data.loader import eval_shard
from approxdist.data.synthetic import make_synthetic
from approxdist.errors import DataError


def write_cifar(root: Path, per_batch: int = 6) -> Path:
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 b"labels": list(rng.integers(0, 10, per_batch))}
        with (d / name).open("wb") as fh:
            pickle.dump(entry, fh)
    return root


def idx_bytes(arr: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, arr.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def test_digits_fixed_split() -> None:
    a, b = load_dataset(DataConfig()), load_dataset(DataConfig())
    assert a.train_x.shape == (1438, 1, 8, 8) and a.test_x.shape == (359, 1, 8, 8)
    assert torch.equal(a.test_y, b.test_y) and a.num_classes == 10


def test_cifar_from_directory(tmp_path: Path) -> None:
    ds = load_dataset(DataConfig(dataset="cifar10", data_dir=str(write_cifar(tmp_path))))
    assert ds.train_x.shape == (30, 3, 32, 32) and ds.test_x.shape == (6, 3, 32, 32)
    assert ds.augmentation == "crop-flip"
    assert abs(float(ds.train_x.mean())) < 1e-5  # normalised with training statistics


def test_cifar_wrong_format(tmp_path: Path) -> None:
    (tmp_path / "data_batch_1").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="not a python-format batch"):
        load_dataset(DataConfig(dataset="cifar10", data_dir=str(tmp_path)))
    with pytest.raises(DataError, match="is not a CIFAR-10 python directory"):
        load_dataset(DataConfig(dataset="cifar10", data_dir=str(tmp_path / "..")))
    with pytest.raises(DataError, match="pass --data-dir"):
        load_dataset(DataConfig(dataset="cifar10"))


def test_mnist_idx(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(idx_bytes(rng.integers(0, 256, (12, 28, 28)))))
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx_bytes(rng.integers(0, 10, 12)))
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(idx_bytes(rng.integers(0, 256, (4, 28, 28))))
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(rng.integers(0, 10, 4)))
    ds = load_dataset(DataConfig(dataset="mnist", data_dir=str(tmp_path)))
    assert ds.train_x.shape == (12, 1, 28, 28) and ds.test_y.shape == (4,)
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(rng.integers(0, 10, 4))[:-1])
    with pytest.raises(DataError, match="truncated"):
        load_dataset(DataConfig(dataset="mnist", data_dir=str(tmp_path)))


def test_unknown_dataset() -> None:
    with pytest.raises(DataError, match="unknown data set 'imagenet'; valid: cifar10, digits"):
        load_dataset(DataConfig(dataset="imagenet"))


def test_synthetic_any_shape() -> None:
    ds = make_synthetic((2, 5), 3, 40, seed=1)
    assert ds.train_x.shape == (40, 2, 5) and int(ds.train_y.max()) < 3


@pytest.mark.parametrize("world", [2, 3, 4])
def eval_shards_are_disjoint_and_form_the_global_batch(world: int) -> None:
    ds = make_synthetic((3,), 2, 60)
    single = list(ShardedBatches(ds, 12, 0, 1, seed=5).epoch(2))
    shards = [list(ShardedBatches(ds, 12, r, world, seed=5).epoch(2)) for r in range(world)]
    for step, (x, _) in enumerate(single):
        parts = [shards[r][step][0] for r in range(world)]
        assert torch.equal(torch.cat(parts), x)
    seen = torch.cat([torch.cat([b[0] for b in s]) for s in shards])
    assert len(torch.unique(seen, dim=0)) == len(seen)


def test_augmentation_independent_of_world_size(tmp_path: Path) -> None:
    ds = load_dataset(DataConfig(dataset="cifar10", data_dir=str(write_cifar(tmp_path))))
    single = next(iter(ShardedBatches(ds, 8, 0, 1, seed=3).epoch(0)))[0]
    halves = [next(iter(ShardedBatches(ds, 8, r, 2, seed=3).epoch(0)))[0] for r in range(2)]
    assert torch.equal(torch.cat(halves), single)
    plain = next(iter(ShardedBatches(ds, 8, 0, 1, seed=3, augment=False).epoch(0)))[0]
    assert not torch.equal(plain, single)


def test_epochs_differ_and_repeat() -> None:
    ds = make_synthetic((3,), 2, 60)
    b = ShardedBatches(ds, 10, 0, 1, seed=0)
    assert not torch.equal(b.order(0), b.order(1))
    assert torch.equal(b.order(1), ShardedBatches(ds, 10, 0, 1, seed=0).order(1))


def test_batch_larger_than_data() -> None:
    with pytest.raises(DataError, match="larger than the training set"):
        ShardedBatches(make_synthetic((3,), 2, 20), 64, 0, 1, seed=0)


def test_eval_shards_cover_test_set() -> None:
    ds = make_synthetic((3,), 2, 50)
    parts = [eval_shard(ds, r, 3)[1] for r in range(3)]
    assert torch.equal(torch.cat(parts), ds.test_y)


def test_mnist1d_generated_locally() -> None:
    a = load_dataset(DataConfig(dataset="mnist1d"))
    assert a.train_x.shape == (4000, 1, 40) and a.test_x.shape == (1000, 1, 40)
    assert set(a.train_y.tolist()) == set(range(10))
    b = load_dataset(DataConfig(dataset="mnist1d"))
    assert torch.equal(a.train_x, b.train_x)  # fixed seed: the same data everywhere


def test_digits_are_read_from_the_store_after_the_first_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from approxdist.data import digits

    monkeypatch.setenv("APPROXDIST_CACHE_DIR", str(tmp_path))
    first = digits.load_digits_dataset()
    assert [p.name.startswith("digits-sklearn") for p in (tmp_path / "data").iterdir()] == [True]

    def no_sklearn() -> None:
        raise AssertionError("built again instead of read from the store")

    monkeypatch.setattr(digits, "_images", no_sklearn)
    again = digits.load_digits_dataset()
    for key in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(again, key), getattr(first, key)), key


def test_mnist1d_is_generated_once_and_a_damaged_cache_is_generated_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from approxdist.data.mnist1d import load_mnist1d

    monkeypatch.setenv("APPROXDIST_CACHE_DIR", str(tmp_path))
    fresh = load_mnist1d(num_samples=300)
    (stored,) = (tmp_path / "data").glob("mnist1d-*-n300-seed42.pt")
    stamp = stored.stat().st_mtime_ns
    again = load_mnist1d(num_samples=300)
    assert stored.stat().st_mtime_ns == stamp  # read, not written again
    stored.write_bytes(stored.read_bytes()[:100])  # cut
    repaired = load_mnist1d(num_samples=300)
    for got in (again, repaired):
        for key in ("train_x", "train_y", "test_x", "test_y"):
            assert torch.equal(getattr(got, key), getattr(fresh, key)), key
    assert [p.name for p in (tmp_path / "data").iterdir()] == [stored.name]  # no temp left
