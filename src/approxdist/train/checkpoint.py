"""Atomic checkpoints (write to a temporary file, then rename), loaded with weights_only=True."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from approxdist.errors import ConfigError

NAME = "checkpoint.pt"


def save_checkpoint(run_dir: str | Path, state: dict[str, Any]) -> Path:
    path = Path(run_dir) / NAME
    tmp = path.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / NAME
    if not path.is_file():
        raise ConfigError(
            f"--resume {str(run_dir)!r}: no {NAME} there; pass a run directory that finished "
            "at least one epoch"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged file becomes one clear error
        raise ConfigError(f"checkpoint {str(path)!r} cannot be read ({exc})") from None
    return dict(state)
