"""Images from a local folder with one sub-folder per class (torchvision's ImageFolder layout).

`D/<class>/<image>`: the classes are the sub-folder names in sorted order (label 0, 1,
...), the images every file Pillow can open, all of one size. The test set is `D/test/`
and the training set `D/train/` when both exist (same class names); otherwise 20 % of
the images, chosen by a fixed seed, are the test set. Greyscale images give one channel,
any other mode is converted to RGB; pixels are scaled to [0, 1] and standardised per
channel with the training set's statistics.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from approxdist.data.base import TensorDataset, fixed_split, normalise
from approxdist.errors import DataError

SPLIT_SEED = 1234


def class_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        raise DataError(f"image folder {str(root)!r} does not exist; pass --data-dir PATH")
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not dirs:
        raise DataError(f"image folder {str(root)!r} has no class sub-folders; put each "
                        f"class's images in D/<class name>/")
    return dirs


def _read(path: Path) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            arr = np.asarray(img if img.mode == "L" else img.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError) as exc:
        raise DataError(f"image {str(path)!r} cannot be read ({exc}); remove it or convert it "
                        f"to PNG/JPEG") from None
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def read_split(root: Path, classes: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Images of `root/<class>/` for each class in `classes`, as (N, C, H, W) floats in [0, 1]."""
    images: list[np.ndarray] = []
    labels: list[int] = []
    first: Path | None = None
    for label, name in enumerate(classes):
        for path in sorted(p for p in (root / name).iterdir() if p.is_file()):
            arr = _read(path)
            if images and arr.shape != images[0].shape:
                raise DataError(f"image folder {str(root)!r} mixes sizes: {str(first)!r} is "
                                f"{_size(images[0])}, {str(path)!r} is {_size(arr)}; resize "
                                f"them to one size")
            first = first or path
            images.append(arr)
            labels.append(label)
    if not images:
        raise DataError(f"image folder {str(root)!r} has class folders but no images in them")
    x = torch.from_numpy(np.stack(images)).float() / 255.0
    return x, torch.tensor(labels, dtype=torch.int64)


def _size(arr: np.ndarray) -> str:
    return f"{arr.shape[2]}x{arr.shape[1]} with {arr.shape[0]} channel(s)"


def load_image_folder(root: str) -> TensorDataset:
    base = Path(root)
    train, test = base / "train", base / "test"
    if train.is_dir() and test.is_dir():
        classes = [p.name for p in class_dirs(train)]
        missing = [c for c in classes if not (test / c).is_dir()]
        if missing:
            raise DataError(f"image folder {str(test)!r} lacks the class folders {missing} "
                            f"that {str(train)!r} has; give both splits the same classes")
        (tx, ty), (ex, ey) = read_split(train, classes), read_split(test, classes)
        if tx.shape[1:] != ex.shape[1:]:
            raise DataError(f"image folder {root!r}: train images are {list(tx.shape[1:])} "
                            f"but test images {list(ex.shape[1:])}; resize them to one size")
    else:
        classes = [p.name for p in class_dirs(base)]
        x, y = read_split(base, classes)
        train_idx, test_idx = fixed_split(len(y), 0.2, SPLIT_SEED)
        tx, ty, ex, ey = x[train_idx], y[train_idx], x[test_idx], y[test_idx]
    tx, ex = normalise(tx, ex)
    return TensorDataset("imagefolder", tx, ty, ex, ey, len(classes), "none")
