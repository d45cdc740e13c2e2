"""AdaPrec hooked into the one trainer: the trainer's side of `adaptive.SpeculativeRun`.

`attach_adaprec(trainer, candidates, val_x, val_y)` adds a step hook that hands the run's
position to an `AdaPrecController` before every step; the controller speculates through
`TrainerRun`, which takes and restores `RunSnapshot`s of the data-parallel engine
(`train/snapshot.py`), trains with `Trainer.train_steps` (the loop's own step), switches
codecs with `DataParallel.set_codecs` and measures the signal on the validation split
held out of the training set (`data/holdout.py`): the mean probability of the true class
(`soft`) or the accuracy, summed over every rank's share. `keep` copies a speculation's
end (state and step outcomes); `adopt` puts the winner's back and hands its steps to the
trainer's loop (`Trainer.ahead`), which counts them as its own instead of training them
again: a speculation draws the batches, rates and random numbers the loop would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.nn import functional as F  # noqa: N812

from approxdist.adaptive.candidates import candidate_rules
from approxdist.adaptive.controller import AdaPrecController
from approxdist.train.engine import StepOutcome
from approxdist.train.engines.data_parallel import DataParallelEngine
from approxdist.train.snapshot import Position, RunSnapshot
from approxdist.train.trainer import Trainer

T = TypeVar("T")


@dataclass(frozen=True)
class Kept:
    """A speculation's end: the run's state there and the outcomes of its steps."""

    snapshot: RunSnapshot
    outs: tuple[StepOutcome, ...]


class TrainerRun:
    """A `SpeculativeRun` over `trainer` (a data-parallel run); `at` is kept up to date by
    the step hook."""

    def __init__(self, trainer: Trainer, wire: str, val_x: torch.Tensor,
                 val_y: torch.Tensor) -> None:
        engine = trainer.engine
        assert isinstance(engine, DataParallelEngine)
        self.trainer, self.engine, self.wire = trainer, engine, wire
        group = trainer.groups.replicas
        lo = val_x.shape[0] * group.rank // group.size
        hi = val_x.shape[0] * (group.rank + 1) // group.size
        self.val_x, self.val_y = val_x[lo:hi], val_y[lo:hi]
        self.total_steps = sum(trainer.shards(e).steps_per_epoch
                               for e in range(trainer.cfg.train.epochs))
        self.chance = 1.0 / trainer.data.num_classes
        self.at = Position(0, 0, 0)
        self._snaps: list[RunSnapshot] = []  # this boundary's and the one before
        self._cursor = self.at
        self._outs: list[StepOutcome] = []  # the steps trained since the last restore
        self.decides = trainer.groups.replicas.is_root

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
        seen = self.trainer.groups.replicas.all_gather_object((walls, finite))
        return [max(w) for w in zip(*(w for w, _ in seen))], all(f for _, f in seen)

    @torch.no_grad()
    def signal(self) -> float:
        module, bs = self.engine.module, self.trainer.cfg.data.test_batch_size
        module.eval()
        sums = torch.zeros(3, dtype=torch.float64)
        dev = self.trainer.ctx.device
        for lo in range(0, self.val_x.shape[0], bs):
            x, y = self.val_x[lo:lo + bs].to(dev), self.val_y[lo:lo + bs].to(dev)
            out = module(x).float()
            prob = F.softmax(out, dim=1).gather(1, y[:, None]).sum()
            hits = (out.argmax(1) == y).sum()
            sums += torch.stack([prob, hits.double(), torch.tensor(y.numel())]).double().cpu()
        module.train()
        self.trainer.groups.replicas.all_reduce(sums)
        soft = self.trainer.cfg.adaprec.signal == "soft"
        return float((sums[0] if soft else sums[1]) / sums[2])

    def agree(self, value: T) -> T:
        return self.trainer.groups.replicas.broadcast_object(value)


def attach_adaprec(trainer: Trainer, wire: str, candidates: tuple[str, ...],
                   val_x: torch.Tensor, val_y: torch.Tensor) -> AdaPrecController:
    """Hook an AdaPrec controller of `wire`'s codec into `trainer` (every rank, before the
    first step)."""
    run = TrainerRun(trainer, wire, val_x, val_y)
    controller = AdaPrecController(candidates, trainer.cfg.adaprec, run)

    def hook(at: Position) -> dict[str, Any] | None:
        run.at = at
        return controller.before_step(at.step)

    trainer.step_hooks.append(hook)
    trainer.summaries.append(lambda: {"adaprec": controller.summary()})
    return controller
