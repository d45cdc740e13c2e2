"""Training runs for the trainer's tests: train from config sections, and the resume check."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from approxdist.config.loader import build_config
from approxdist.launch.context import DistContext
from approxdist.train.build import build_trainer
from approxdist.train.checkpoint import NAME

Sections = dict[str, dict[str, Any]]
State = dict[str, torch.Tensor]


def train(ctx: DistContext, sections: Sections, run_dir: Path, epochs: int,
          resume: bool = False, ran: dict[int, int] | None = None) -> State:
    """Train `epochs` (in all) with `sections` into `run_dir`; this rank's final weights.
    `ran` gets, per epoch the run trained, how many steps its engine trained in it."""
    sec = {k: dict(v) for k, v in sections.items()}
    sec["train"]["epochs"] = epochs
    trainer = build_trainer(build_config(sec), ctx, run_dir, resume)
    if ran is not None:
        _count_steps(trainer, ran)
    trainer.run()
    return {k: v.clone() for k, v in trainer.engine.module.state_dict().items()}


def _count_steps(trainer: Any, ran: dict[int, int]) -> None:
    """Count the engine's training steps per epoch into `ran`."""
    epoch = [-1]
    step = trainer.engine.train_step

    def start(e: int) -> None:
        epoch[0] = e
        ran[e] = 0

    def counted(*args: Any) -> Any:
        ran[epoch[0]] += 1
        return step(*args)

    trainer.epoch_hooks.append(start)
    trainer.engine.train_step = counted


def full_and_resumed(ctx: DistContext, sections: Sections, root: str) -> tuple[State, State]:
    """3 epochs straight, and 1 epoch then a resume to 3, in the same processes.

    The resumed run must train only epochs 2 and 3, with as many steps each as the
    straight run (a resume that trained from scratch and landed on the same weights, or
    skipped an epoch, fails here; the callers compare the weights)."""
    full, resumed, _ = _runs(ctx, sections, Path(root), moved=False)
    return full, resumed


def full_resumed_and_moved(ctx: DistContext, sections: Sections, root: str
                           ) -> tuple[State, State, State]:
    """`full_and_resumed`, and a copy of the 1-epoch run resumed to 3 from checkpoints whose
    weights were moved by 0.01 (`move_weights`): a resume that read other weights than it
    was given (or none) would end where the plain resume does."""
    full, resumed, moved = _runs(ctx, sections, Path(root), moved=True)
    assert moved is not None
    return full, resumed, moved


def move_weights(run_dir: Path, by: float = 0.01) -> None:
    """Every checkpoint of `run_dir` (one per part of the model) with its floating-point
    weights moved by `by`."""
    paths = sorted(run_dir.rglob(NAME))
    assert paths, f"no {NAME} under {run_dir}"
    for path in paths:
        state = torch.load(path, weights_only=False)
        state["model"] = {k: v + by if v.is_floating_point() else v
                          for k, v in state["model"].items()}
        torch.save(state, path)


def _runs(ctx: DistContext, sections: Sections, root: Path, moved: bool
          ) -> tuple[State, State, State | None]:
    full: dict[int, int] = {}
    part: dict[int, int] = {}
    resumed: dict[int, int] = {}
    weights = train(ctx, sections, root / "full", 3, ran=full)
    train(ctx, sections, root / "part", 1, ran=part)
    if moved:
        _barrier(ctx)  # every part's checkpoint is written
        if ctx.rank == 0:
            shutil.copytree(root / "part", root / "moved")
            move_weights(root / "moved")
        _barrier(ctx)
    out = train(ctx, sections, root / "part", 3, resume=True, ran=resumed)
    assert sorted(full) == [0, 1, 2] and all(n > 0 for n in full.values()), full
    assert part == {0: full[0]}, (part, full)
    assert resumed == {1: full[1], 2: full[2]}, \
        f"rank {ctx.rank}: the resumed run trained {resumed} (epoch: steps), not {full} less epoch 0"
    return weights, out, train(ctx, sections, root / "moved", 3, resume=True) if moved else None


def _barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def rank_dies(ctx: DistContext, sections: Sections, root: str, victim: int) -> None:
    """Train 3 epochs; global rank `victim` exits abruptly as epoch 2 starts (a dead peer)."""
    sec = {k: dict(v) for k, v in sections.items()}
    sec["train"]["epochs"] = 3
    trainer = build_trainer(build_config(sec), ctx, Path(root), False)

    def die(epoch: int) -> None:
        if epoch == 1 and ctx.rank == victim:
            os._exit(3)

    trainer.epoch_hooks.append(die)
    trainer.run()
