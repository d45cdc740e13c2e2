"""Training runs for the trainer's tests: train from config sections, and the resume check."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from approxdist.config.loader import build_config
from approxdist.launch.context import DistContext
from approxdist.train.build import build_trainer

Sections = dict[str, dict[str, Any]]
State = dict[str, torch.Tensor]


def train(ctx: DistContext, sections: Sections, run_dir: Path, epochs: int,
          resume: bool = False) -> State:
    """Train `epochs` (in all) with `sections` into `run_dir`; this rank's final weights."""
    sec = {k: dict(v) for k, v in sections.items()}
    sec["train"]["epochs"] = epochs
    trainer = build_trainer(build_config(sec), ctx, run_dir, resume)
    trainer.run()
    return {k: v.clone() for k, v in trainer.engine.module.state_dict().items()}


def full_and_resumed(ctx: DistContext, sections: Sections, root: str) -> tuple[State, State]:
    """3 epochs straight, and 1 epoch then a resume to 3, in the same processes."""
    full = train(ctx, sections, Path(root) / "full", 3)
    train(ctx, sections, Path(root) / "part", 1)
    return full, train(ctx, sections, Path(root) / "part", 3, resume=True)


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
