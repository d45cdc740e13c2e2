"""Where checkpoints go and how every rank agrees on resuming from them.

One checkpoint per pipeline stage, written by the stage's first replica (the replicas
hold the same weights; per-replica state such as error-feedback residuals is gathered
into it by the engine): `RUN_DIR/checkpoint.pt` when the mesh has one stage (single
process, data parallel), `RUN_DIR/stage<s>/checkpoint.pt` otherwise. On resume each
stage's first replica reads its file and hands it to its replicas; first every rank
learns whether every stage found a readable checkpoint at the same epoch, so a missing or
stale file is one error on every rank, never a hang.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from approxdist.errors import ApproxDistError, ConfigError
from approxdist.topology.groups import MeshGroups
from approxdist.train.checkpoint import load_checkpoint, save_checkpoint

_PROGRESS = ("epoch", "step", "elapsed_s", "bytes_sent", "history")


@dataclass
class Progress:
    """What a checkpoint must carry besides the engine's state to continue bit-exactly."""

    epoch: int = 0
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)  # the epoch records so far
    elapsed_s: float = 0.0
    bytes_sent: int = 0


#: what a run writes into its directory besides config.toml (`clear_run_outputs`)
RUN_FILES = ("metrics.jsonl", "summary.json", "checkpoint.pt", "trace.json")
_RUN_DIRS = re.compile(r"^(workers|stage\d+|shard\d+)$")
_RANK_TRACES = re.compile(r"^trace\.rank\d+\.json$")


def clear_run_outputs(run_dir: Path) -> list[str]:
    """Remove what an earlier run wrote into `run_dir` (metrics, summary, checkpoints,
    traces, worker files), so a fresh run there does not append to its metrics or leave
    another mesh's stage checkpoints for a later `--resume`; the names removed."""
    if not run_dir.is_dir():
        return []
    gone = []
    for entry in sorted(run_dir.iterdir()):
        if entry.is_dir() and _RUN_DIRS.match(entry.name):
            shutil.rmtree(entry)
        elif entry.is_file() and (entry.name in RUN_FILES or _RANK_TRACES.match(entry.name)):
            entry.unlink()
        else:
            continue
        gone.append(entry.name)
    return gone


def checkpoint_dir(run_dir: Path, groups: MeshGroups) -> Path:
    """The directory of this rank's part's checkpoint: the run directory, or
    `stage<s>/` per pipeline stage, `shard<t>/` per tensor-parallel shard (both nested)."""
    out = run_dir
    if groups.mesh.num_stages > 1:
        out = out / f"stage{groups.place.stage}"
    if groups.mesh.extent("tp") > 1:
        out = out / f"shard{groups.place.shard}"
    return out


def _part(groups: MeshGroups) -> str:
    """`"stage 1"`, `"stage 0, shard 1"`: this rank's part, for messages."""
    shard = f", shard {groups.place.shard}" if groups.mesh.extent("tp") > 1 else ""
    return f"stage {groups.place.stage}{shard}"


def save_progress(directory: Path, progress: Progress, engine_state: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_checkpoint(directory, {**engine_state, **{k: getattr(progress, k) for k in _PROGRESS}})


def load_agreed(directory: Path, groups: MeshGroups) -> tuple[Progress, dict[str, Any]]:
    """(progress, engine state) of this rank's stage, once every stage agrees (collective)."""
    state: dict[str, Any] | None = None
    problem = ""
    if groups.stage.is_root:
        try:
            state = load_checkpoint(directory)
        except ApproxDistError as exc:
            problem = str(exc)
    found = (groups.stage.is_root, _part(groups), problem,
             state["epoch"] if state is not None else None)
    readers = [f[1:] for f in groups.world.all_gather_object(found) if f[0]]
    missing = [f"{s}: {p}" for s, p, _ in readers if p]
    if missing:
        raise ConfigError("cannot resume: " + "; ".join(dict.fromkeys(missing)))
    epochs = {s: e for s, _, e in readers}
    if len(set(epochs.values())) > 1:
        raise ConfigError("stage checkpoints disagree: " + ", ".join(
            f"{s} at epoch {e}" for s, e in sorted(epochs.items()))
            + "; a stage died while saving, restart from scratch")
    state = groups.stage.broadcast_object(state)
    assert state is not None
    progress = Progress(**{k: state[k] for k in _PROGRESS})
    progress.history = list(progress.history)
    return progress, {k: v for k, v in state.items() if k not in _PROGRESS}
