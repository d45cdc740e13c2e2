"""Where checkpoints go and how every rank agrees on resuming from them.

One checkpoint per part of the model (a pipeline stage's tensor-parallel shard), written
by the part's first replica (the replicas hold the same weights; per-replica state such
as error-feedback residuals is gathered into it by the engine): `RUN_DIR/checkpoint.pt`
when the mesh has one part (single process, data parallel), else in `stage<s>/` per
pipeline stage and `shard<t>/` per tensor-parallel shard (both nested). On resume each
part's first replica reads its file and hands it to its replicas; first every rank
learns whether every part found a readable checkpoint at the same epoch, so a missing or
stale file is one error on every rank, never a hang. Saving agrees the same way: when a
stage's checkpoint (or rank 0's metrics) could not be written, every rank stops with the
same `AgreedError` after that epoch, and the last good checkpoint stays whole
(`train/checkpoint.py`).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from approxdist.errors import ApproxDistError, ConfigError
from approxdist.topology.groups import MeshGroups
from approxdist.topology.mesh import Mesh
from approxdist.train.checkpoint import NAME, commit, discard, load_checkpoint, write_pending

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


class AgreedError(ConfigError):
    """An error every rank raises together (a collective agreed on it), so the launcher
    can report it once, in one line, instead of as a failed worker."""


def parts(mesh: Mesh) -> list[tuple[int, int]]:
    """Every part of the model in `mesh` that has its own checkpoint: (stage, shard)."""
    return [(stage, shard) for stage in range(mesh.num_stages)
            for shard in range(mesh.extent("tp"))]


def part_dir(run_dir: Path, mesh: Mesh, stage: int, shard: int) -> Path:
    """The directory of part (`stage`, `shard`)'s checkpoint: the run directory, or
    `stage<s>/` per pipeline stage, `shard<t>/` per tensor-parallel shard (both nested)."""
    out = run_dir
    if mesh.num_stages > 1:
        out = out / f"stage{stage}"
    if mesh.extent("tp") > 1:
        out = out / f"shard{shard}"
    return out


def part_name(mesh: Mesh, stage: int, shard: int) -> str:
    """`"stage 1"`, `"stage 0, shard 1"`: a part, for messages."""
    return f"stage {stage}" + (f", shard {shard}" if mesh.extent("tp") > 1 else "")


def checkpoint_dir(run_dir: Path, groups: MeshGroups) -> Path:
    """The directory of this rank's part's checkpoint."""
    return part_dir(run_dir, groups.mesh, groups.place.stage, groups.place.shard)


def save_agreed(run_dir: Path, groups: MeshGroups, progress: Progress,
                engine_state: dict[str, Any] | None, problem: str = "") -> None:
    """Save this stage's checkpoint (`engine_state` on its first replica, None elsewhere)
    in two steps: every stage writes its file aside, every rank learns whether all did
    (collective), then each renames it over its last one. `problem`: what else this rank
    could not write (its metrics). If any failed, no stage renames, the last checkpoints
    stay as they were, and every rank raises the same `AgreedError`."""
    directory = checkpoint_dir(run_dir, groups)
    if engine_state is not None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            write_pending(directory, {**engine_state,
                                      **{k: getattr(progress, k) for k in _PROGRESS}})
        except OSError as exc:
            failed = f"cannot write {directory / NAME} ({exc.strerror or exc})"
            problem = f"{problem}; {failed}" if problem else failed
    problems = [p for p in groups.world.all_gather_object(problem) if p]
    if not problems:
        if engine_state is not None:
            commit(directory)
        return
    discard(directory)
    before = progress.epoch - 1
    kept = (f"its checkpoint of epoch {before} is intact" if before else
            "no epoch had been saved")
    raise AgreedError(f"{'; '.join(dict.fromkeys(problems))}: the run stopped after epoch "
                      f"{progress.epoch} and {kept}; free space or make the run directory "
                      f"writable, then continue with --resume {run_dir}")


def saved_epoch(state: dict[str, Any], directory: Path) -> int:
    """The epoch a loaded checkpoint was saved after (one error line if it has none)."""
    epoch = state.get("epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ConfigError(f"checkpoint {str(directory / NAME)!r} has no epoch count "
                          f"(epoch = {epoch!r}): it is not a checkpoint of approxdist train; "
                          f"restore it from a copy, or start a new run with --out DIR")
    missing = [k for k in _PROGRESS if k not in state]
    if missing:
        raise ConfigError(f"checkpoint {str(directory / NAME)!r} lacks {', '.join(missing)}: "
                          f"it is not a checkpoint of approxdist train; restore it from a "
                          f"copy, or start a new run with --out DIR")
    return epoch


def disagreement(epochs: dict[str, int]) -> str:
    """The message for parts' checkpoints (by `part_name`, in order) saved after different
    epochs ('' if they agree)."""
    if len(set(epochs.values())) <= 1:
        return ""
    return ("stage checkpoints disagree: " + "; ".join(
        f"{part} at epoch {e}" for part, e in epochs.items())
        + "; a stage died while saving: restore the stages' checkpoints from a copy, or "
          "start a new run with --out DIR")


def load_agreed(directory: Path, groups: MeshGroups) -> tuple[Progress, dict[str, Any]]:
    """(progress, engine state) of this rank's stage, once every stage agrees (collective;
    the same `AgreedError` on every rank otherwise)."""
    state: dict[str, Any] | None = None
    problem, epoch = "", None
    if groups.stage.is_root:
        try:
            state = load_checkpoint(directory)
            epoch = saved_epoch(state, directory)
        except ApproxDistError as exc:
            problem = str(exc)
    part = part_name(groups.mesh, groups.place.stage, groups.place.shard)
    found = (groups.stage.is_root, part, problem, epoch)
    readers = [f[1:] for f in groups.world.all_gather_object(found) if f[0]]
    missing = [f"{s}: {p}" for s, p, _ in readers if p]
    if missing:
        raise AgreedError("cannot resume: " + "; ".join(dict.fromkeys(missing)))
    differ = disagreement({s: e for s, _, e in readers})
    if differ:
        raise AgreedError(differ)
    state = groups.stage.broadcast_object(state)
    assert state is not None
    progress = Progress(**{k: state[k] for k in _PROGRESS})
    progress.history = list(progress.history)
    return progress, {k: v for k, v in state.items() if k not in _PROGRESS}
