"""Byte-level language modelling on the Python standard library's own source: no download.

The text is the `*.py` files directly inside the running interpreter's standard-library
directory (`sysconfig.get_paths()["stdlib"]`; subpackages are left out), in sorted file
name order. The split is by file: a file is validation text when the CRC-32 of its name
is divisible by 10 (about one file in ten), training text otherwise, so no window
straddles the two. Each split is its files' bytes concatenated and cut at a bound
(`TRAIN_BYTES`, `VALID_BYTES`), then cut into non-overlapping windows of `seq_len`
bytes: a sample is (bytes t..t+T-1, bytes t+1..t+T), token ids 0..255 as int64, and the
task is next-token prediction. The same Python version gives the same data set on every
machine; another version's standard library gives a slightly different one.
"""

from __future__ import annotations

import sysconfig
import zlib
from pathlib import Path

import torch

from approxdist.data.base import TensorDataset
from approxdist.errors import DataError

TRAIN_BYTES = 1 << 18
VALID_BYTES = 1 << 16
VOCAB = 256


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_validation(name: str) -> bool:
    """The split rule: CRC-32 of the file name divisible by 10."""
    return zlib.crc32(name.encode()) % 10 == 0


def split_files(root: Path) -> tuple[list[Path], list[Path]]:
    """(training files, validation files) of `root`, each in sorted name order."""
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    return ([p for p in files if not is_validation(p.name)],
            [p for p in files if is_validation(p.name)])


def read_bounded(files: list[Path], limit: int) -> bytes:
    """The files' bytes in order, cut at `limit` bytes (later files are not read)."""
    parts, total = [], 0
    for path in files:
        if total >= limit:
            break
        data = path.read_bytes()
        parts.append(data)
        total += len(data)
    return b"".join(parts)[:limit]


def windows(text: bytes, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping (input, next-byte target) windows of `seq_len` bytes, int64."""
    ids = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    n = (len(ids) - 1) // seq_len
    x = ids[:n * seq_len].view(n, seq_len)
    y = ids[1:n * seq_len + 1].view(n, seq_len)
    return x.contiguous(), y.contiguous()


def load_stdlib_text(seq_len: int, root: Path | None = None) -> TensorDataset:
    base = root if root is not None else stdlib_dir()
    train_files, valid_files = split_files(base)
    if not train_files or not valid_files:
        raise DataError(f"data set 'stdlib-text' found {len(train_files)} training and "
                        f"{len(valid_files)} validation .py files in {str(base)!r}; it needs a "
                        f"Python with its standard-library sources installed")
    train_x, train_y = windows(read_bounded(train_files, TRAIN_BYTES), seq_len)
    test_x, test_y = windows(read_bounded(valid_files, VALID_BYTES), seq_len)
    if not len(train_x) or not len(test_x):
        raise DataError(f"data.seq_len = {seq_len} leaves no whole window of text; "
                        f"use a length below {VALID_BYTES // 4}")
    return TensorDataset("stdlib-text", train_x, train_y, test_x, test_y, VOCAB, "none",
                         task="next-token")
