"""Atomic checkpoints (written to a temporary file, flushed to disk, then renamed over the
last one, so a failed write leaves the last good checkpoint whole; the two steps apart
let every stage of a pipeline write before any renames), loaded with weights_only=True;
a damaged file is one error line naming it."""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from approxdist.errors import ConfigError

NAME = "checkpoint.pt"
#: the temporary file a checkpoint is written to before it replaces `NAME`
TMP_NAME = NAME + ".tmp"


def save_checkpoint(run_dir: str | Path, state: dict[str, Any]) -> Path:
    """Write `state` to `run_dir/checkpoint.pt` atomically (`write_pending`, then
    `commit`); on a failure the last checkpoint is left as it was."""
    write_pending(run_dir, state)
    return commit(run_dir)


def write_pending(run_dir: str | Path, state: dict[str, Any]) -> Path:
    """Write `state` to the temporary file beside `checkpoint.pt` and flush it to disk; on
    any failure (a full disk, a folder that became read-only) the temporary file is
    removed and the `OSError` propagates."""
    tmp = Path(run_dir) / TMP_NAME
    try:
        with open(tmp, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        discard(run_dir)
        raise
    return tmp


def commit(run_dir: str | Path) -> Path:
    """Rename the pending checkpoint over the last one (one step: never half of each)."""
    path = Path(run_dir) / NAME
    os.replace(Path(run_dir) / TMP_NAME, path)
    return path


def discard(run_dir: str | Path) -> None:
    """Remove a pending checkpoint, if any (the last one stays)."""
    with contextlib.suppress(OSError):
        (Path(run_dir) / TMP_NAME).unlink()


def load_checkpoint(run_dir: str | Path) -> dict[str, Any]:
    """The state saved in `run_dir/checkpoint.pt` (a `ConfigError` line when it is missing,
    damaged or not a checkpoint)."""
    path = Path(run_dir) / NAME
    if not path.is_file():
        raise ConfigError(
            f"--resume {str(run_dir)!r}: no {NAME} there; pass a run directory that finished "
            "at least one epoch"
        )
    try:
        with warnings.catch_warnings():  # torch warns about odd pickles: the error says it
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged file becomes one clear error
        raise damaged(path, why(exc)) from None
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise damaged(path, f"it holds a {type(state).__name__}, not a table of named state")
    return state


def damaged(path: Path, reason: str) -> ConfigError:
    return ConfigError(f"checkpoint {str(path)!r} cannot be read ({reason}): it is damaged or "
                       f"not an approxdist checkpoint; restore it from a copy, or start a new "
                       f"run with --out DIR")


def why(exc: BaseException) -> str:
    """The first sentence of `exc`'s message, on one line (torch's run to many lines)."""
    text = " ".join(str(exc).split())
    if not text:
        return f"{type(exc).__name__}, e.g. an empty or cut-off file"
    first = text.split(". ")[0].rstrip(".")
    return first if len(first) <= 160 else first[:157] + "..."
