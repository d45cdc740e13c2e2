"""AdaPrec hooked into the one trainer: the trainer's side of `adaptive.run.SpeculativeRun`.

`attach_adaprec(trainer, wire, candidates, val_x, val_y)` adds a step hook that hands the
run's position to an `AdaPrecController` before every step; the controller speculates
through `TrainerRun`, which takes and restores `RunSnapshot`s of the engine
(`train/snapshot.py`: any engine with a gradient wire and a local state, data
parallelism, a hybrid's replicated stages, a parameter server's pushes), trains with
`Trainer.train_steps` (the loop's own step), switches the gradient wire `wire` with the
engine's `set_wire` and measures the signal on the validation split held out of the
training set (`data/holdout.py`), scored by the engine on its share of it as it
evaluates (`score_batch`): the mean probability of the true class (`soft`) or the
accuracy, summed over the world; what the codecs do to the gradients is the engine's
(`Engine.update_error`), merged over the world. Every rank takes rank 0's decisions.
`keep` copies a speculation's end (state and step outcomes); `adopt` puts the winner's
back and hands its steps to the trainer's loop (`Trainer.ahead`), which counts them as
its own instead of training them again: a speculation draws the batches, rates and
random numbers the loop would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from approxdist.adaptive.candidates import candidate_rules
from approxdist.adaptive.controller import AdaPrecController
from approxdist.comm.update_error import Sums, merge
from approxdist.data.loader import eval_shard_of
from approxdist.train.engine import StepOutcome
from approxdist.train.snapshot import Position, RunSnapshot
from approxdist.train.trainer import Trainer

T = TypeVar("T")


@dataclass(frozen=True)
class Kept:
    """A speculation's end: the run's state there and the outcomes of its steps."""

    snapshot: RunSnapshot
    outs: tuple[StepOutcome, ...]


class TrainerRun:
    """A `SpeculativeRun` over `trainer` (any engine with a gradient wire `wire`); `at` is
    kept up to date by the step hook."""

    def __init__(self, trainer: Trainer, wire: str, val_x: torch.Tensor,
                 val_y: torch.Tensor) -> None:
        self.trainer, self.engine, self.wire = trainer, trainer.engine, wire
        self.world = trainer.groups.world
        self.val_x, self.val_y = eval_shard_of(val_x, val_y, *trainer.engine.shard)
        self.total_steps = sum(trainer.shards(e).steps_per_epoch
                               for e in range(trainer.cfg.train.epochs))
        self.chance = 1.0 / trainer.data.num_classes
        self.at = Position(0, 0, 0)
        self._snaps: list[RunSnapshot] = []  # this boundary's and the one before
        self._cursor = self.at
        self._outs: list[StepOutcome] = []  # the steps trained since the last restore
        self.decides = self.world.is_root

    def snapshot(self) -> None:
        self._snaps = [*self._snaps[-1:], RunSnapshot.take(self.engine, self.at)]
        self._cursor = self.at

    def restore(self) -> None:
        self._cursor = self._snaps[-1].restore(self.engine)
        self._outs = []

    def keep(self) -> Kept | None:
        # the loop goes on within its epoch only (an epoch's end syncs buffers, evaluates)
        if self.at.index + len(self._outs) > self.trainer.shards(self.at.epoch).steps_per_epoch:
            return None
        return Kept(RunSnapshot.take(self.engine, self._cursor), tuple(self._outs))

    def adopt(self, kept: Kept) -> None:
        kept.snapshot.restore(self.engine)
        self._cursor = kept.snapshot.position
        self.trainer.ahead = list(kept.outs)

    def drop(self) -> None:
        self._snaps.pop()

    def rollback(self) -> None:
        self._snaps[-1].restore(self.engine)
        self._cursor = self.at

    def use(self, candidate: str) -> None:
        rules, codec = candidate_rules(candidate, self.trainer.cfg.wire.wire(self.wire).rules)
        self.engine.set_wire(self.wire, codec, rules)

    def train(self, steps: int) -> tuple[list[float], bool]:
        # the generators go on from the snapshot's (or the last chunk's) state: every
        # candidate draws the dropout masks the run itself would draw
        outs = self.trainer.train_steps(self._cursor, steps)
        self._outs += outs
        epoch, index = self._cursor.epoch, self._cursor.index + steps
        while index >= self.trainer.shards(epoch).steps_per_epoch:
            index -= self.trainer.shards(epoch).steps_per_epoch
            epoch += 1
        self._cursor = Position(epoch, index, self._cursor.step + steps)
        walls = [o.times.wall_s for o in outs]
        finite = all(o.loss is None or math.isfinite(o.loss) for o in outs)
        seen = self.world.all_gather_object((walls, finite))
        return [max(w) for w in zip(*(w for w, _ in seen))], all(f for _, f in seen)

    @torch.no_grad()
    def signal(self) -> float:
        engine, bs = self.engine, self.trainer.cfg.data.test_batch_size
        engine.module.eval()
        sums = torch.zeros(3, dtype=torch.float64)
        dev = self.trainer.ctx.device
        for lo in range(0, self.val_x.shape[0], bs):
            x, y = self.val_x[lo:lo + bs], self.val_y[lo:lo + bs]
            sums += torch.tensor(engine.score_batch(
                x.to(dev) if engine.feeds_inputs else None,
                y.to(dev) if engine.feeds_labels else None, y.shape[0]), dtype=torch.float64)
        engine.module.train()
        self.world.all_reduce(sums)
        soft = self.trainer.cfg.adaprec.signal == "soft"
        return float((sums[0] if soft else sums[1]) / sums[2])

    def watch(self, on: bool) -> None:
        self.engine.update_error(False)
        if on:
            self.engine.update_error(True)

    def update_error(self) -> Sums:
        return merge(self.world.all_gather_object(self.engine.update_error(True)))

    def agree(self, value: T) -> T:
        return self.world.broadcast_object(value)


def attach_adaprec(trainer: Trainer, wire: str, candidates: tuple[str, ...],
                   val_x: torch.Tensor, val_y: torch.Tensor) -> AdaPrecController:
    """Hook an AdaPrec controller of `wire`'s codec into `trainer` (every rank, before the
    first step)."""
    run = TrainerRun(trainer, wire, val_x, val_y)
    controller = AdaPrecController(candidates, trainer.cfg.adaprec, run)

    def hook(at: Position) -> dict[str, Any] | None:
        run.at = at
        record = controller.before_step(at.step)
        return None if record is None else {**record, "wire": wire}

    trainer.step_hooks.append(hook)
    trainer.summaries.append(lambda: {"adaprec": controller.summary()})
    return controller
