"""Data sets built once per machine and read back by every rank of every later run.

Building some bundled data sets costs a rank seconds of CPU before its first step
(MNIST-1D's generator; scikit-learn's import for the digits). `stored` keeps the built
tensors in the cache folder (`approxdist.cache`, under `data/`), in a file named by
what the data depends on (the package's version, the sample count, the seed); a file
that cannot be read whole is built again, and a cache that cannot be written is skipped.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from approxdist.cache import cache_dir
from approxdist.errors import DataError

Tensors = dict[str, torch.Tensor]


def package_version(package: str, data_set: str) -> str:
    """The installed version of the package that builds `data_set` (no import of it)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise DataError(f"data set '{data_set}' needs the {package} package: "
                        f"pip install {package}") from None


def stored(name: str, keys: Sequence[str], build: Callable[[], Tensors]) -> Tensors:
    """The tensors `keys` of the data set file `name` (e.g. `digits-sklearn1.5.2`): read
    from the cache, or built by `build` and stored."""
    path = cache_dir() / "data" / f"{name}.pt"
    found = _read(path, keys)
    if found is not None:
        return found
    built = build()
    _write(path, built)
    return built


def _read(path: Path, keys: Sequence[str]) -> Tensors | None:
    try:
        raw = torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - missing, cut or foreign: build it again
        return None
    ok = isinstance(raw, dict) and all(isinstance(raw.get(k), torch.Tensor) for k in keys)
    return raw if ok else None


def _write(path: Path, tensors: Tensors) -> None:
    """Atomically (ranks may build at once: the last rename wins, with equal contents)."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        try:
            torch.save(tensors, tmp)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
