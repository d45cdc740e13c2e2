"""What `--resume RUN_DIR` checks before it writes anything or starts a worker: the run
asked for is the run saved (its mode, ranks, mesh, pipeline partition and schedule,
servers and workers, model), and every part's checkpoint (each stage's, each
tensor-parallel shard's) is there, readable, saved after the same epoch and short of the
epochs asked for. Each refusal is one line naming the saved and the asked value and how
to go on (docs/training.md, Resuming)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from approxdist.config.schema import Config
from approxdist.errors import ConfigError
from approxdist.topology import Mesh
from approxdist.train.checkpoint import NAME, load_checkpoint
from approxdist.train.mode import mesh_of
from approxdist.train.resume import disagreement, part_dir, part_name, parts, saved_epoch

#: the keys a resumed run keeps, and what they fix: which ranks hold which checkpoint,
#: and what is in it
KEPT = {
    "train.parallel": "its parallel mode",
    "train.world_size": "its ranks",
    "pipeline.stages": "its pipeline stages",
    "pipeline.split": "its pipeline partition",
    "pipeline.balance": "its pipeline partition",
    "pipeline.replicas": "its stages' replicas",
    "pipeline.schedule": "its pipeline schedule",
    "ps.servers": "its servers",
    "ps.workers": "its workers",
    "tp.plan": "the split of its layers (its checkpoints hold their shards)",
    "model.name": "its model",
    "model.shortcut": "its model",
    "model.width": "its model",
    "model.hidden": "its model",
    "model.depth": "its model",
    "model.args": "its model",
    "data.dataset": "the samples its model takes",
    "data.synthetic_shape": "the samples its model takes",
    "data.synthetic_classes": "the samples its model takes",
    "data.seq_len": "the samples its model takes",
    "train.mesh": "its mesh",  # last: a key above names a change more plainly
}


def value(cfg: Config, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _shape(mesh: Mesh) -> list[tuple[str, tuple[int, ...]]]:
    """A mesh's axes and their sizes, axes of size 1 left out (`pp=2` is `pp=2,dp=1`)."""
    return [(a.name, tuple(a.sizes)) for a in mesh.axes if any(n != 1 for n in a.sizes)]


def check_unchanged(saved: Config, asked: Config, run_dir: Path,
                    flag_of: Mapping[str, str]) -> None:
    """Refuse, in one line, an asked config that changes a key `KEPT` of the saved run
    (the mesh compared axis by axis: `--mesh dp=2` says what a 2-rank dp run is);
    `flag_of` names the flag this command set a key with."""
    for key, what in KEPT.items():
        was, now = value(saved, key), value(asked, key)
        if key == "train.mesh":
            was, now = mesh_of(saved), mesh_of(asked)
            if _shape(was) == _shape(now):
                continue
            was, now = was.spec, now.spec
        if was == now:
            continue
        flag = flag_of.get(key)
        by = f" ({flag})" if flag else ""
        drop = f"drop {flag}" if flag else f"set {key} back to {was!r}"
        raise ConfigError(f"--resume {str(run_dir)!r}: the run was trained with {key} = {was!r} "
                          f"and this asks for {now!r}{by}; a resumed run keeps {what}: {drop}, "
                          f"or start a new run with --out DIR")


def check_checkpoints(run_dir: Path, mesh: Mesh, epochs_asked: int) -> int:
    """The epoch the checkpoint of every part of `mesh` (a stage, a tensor-parallel shard)
    was saved after (each part's file there, readable and at the same epoch, short of
    `epochs_asked`); one error line otherwise."""
    epochs: dict[str, int] = {}
    missing: list[str] = []
    for stage, shard in parts(mesh):
        directory = part_dir(run_dir, mesh, stage, shard)
        if not (directory / NAME).is_file():
            missing.append(str(directory / NAME))
            continue
        epochs[part_name(mesh, stage, shard)] = saved_epoch(load_checkpoint(directory),
                                                            directory)
    if missing and not epochs:
        raise ConfigError(f"--resume {str(run_dir)!r}: no {NAME} there"
                          + (f" nor in its stage or shard folders ({', '.join(missing)})"
                             if len(missing) > 1 else "")
                          + "; the run finished no epoch: start it again without --resume")
    if missing:
        raise ConfigError(f"--resume {str(run_dir)!r}: {', '.join(missing)} is missing while "
                          f"the other checkpoints are there (epoch "
                          f"{max(epochs.values())}); restore it from a copy, or start a new "
                          f"run with --out DIR")
    differ = disagreement(epochs)
    if differ:
        raise ConfigError(f"--resume {str(run_dir)!r}: {differ}")
    epoch = next(iter(epochs.values()))
    if epoch >= epochs_asked:
        raise ConfigError(f"--resume {str(run_dir)!r}: the run has trained {epoch} of its "
                          f"{epochs_asked} epochs already; ask for more with --epochs "
                          f"{epoch + 1} or more")
    return epoch
