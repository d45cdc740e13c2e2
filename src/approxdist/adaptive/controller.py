"""The AdaPrec controller (seed 004): phases of K steps, speculation, a decision per boundary.

    controller = AdaPrecController(("fp32", "fp8-e5m2", "table4", "table1"), cfg, run)
    record = controller.before_step(step)     # the trainer calls it before every step

The first phase runs `cfg.first`. At each boundary (every `phase_steps` steps, while a
whole speculation still fits in the run) the controller measures the run's signal,
snapshots the run, and for each candidate not blacklisted restores the snapshot, switches
the gradients' codecs to it and trains `speculate_steps` steps, measuring the signal at
`points` points and the seconds per step (slowest rank). It then restores the snapshot
once more, judges the candidates (`decide.py`) and switches to the winner, so training
itself only ever continues from the snapshot: a speculation that diverged leaves no
trace. A chosen codec can still turn bad after the speculation's few steps: when the
signal at a boundary has collapsed since the last one (`decide.collapsed`), the phase is
undone (the model, optimiser and residuals of the last boundary's snapshot, the data
position and learning rate where they are: the phase's steps are lost time) and its
codec blacklisted. When speculation has taken more than `overhead_budget` of the run's
time so far, the boundary keeps the current codec without speculating.

The controller drives a `SpeculativeRun` (the trainer's, `train/speculation.py`); every
rank calls it in step, so every collective inside matches, and the winner is rank 0's.
Each boundary returns its record for metrics.jsonl (`kind: adaprec`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Protocol, TypeVar

from approxdist.adaptive.decide import Assessment, Point, Trial, assess_all, choose, collapsed
from approxdist.adaptive.learning_curve import LearningCurveModel
from approxdist.config.adaprec import AdaPrecConfig

T = TypeVar("T")


class SpeculativeRun(Protocol):
    """What the controller needs from a training run (collectives: every rank calls)."""

    #: the run's last step, and the signal a model that guesses would score
    total_steps: int
    chance: float

    def snapshot(self) -> None:
        """Remember the run's state at its current position (the one before is kept too)."""

    def restore(self) -> None:
        """Back to the latest snapshot (any number of times)."""

    def drop(self) -> None:
        """Forget the latest snapshot: the one before it is the latest again."""

    def rollback(self) -> None:
        """The latest snapshot's state (model, optimiser, residuals), at the run's current
        position (the steps since are undone, the data and learning rate go on)."""

    def use(self, candidate: str) -> None:
        """Send the gradients in `candidate`'s codecs from the next step on."""

    def train(self, steps: int) -> tuple[list[float], bool]:
        """Train `steps` steps on; (each step's seconds on the slowest rank, every loss
        finite)."""

    def signal(self) -> float:
        """The validation signal of the model now, agreed by every rank."""

    def agree(self, value: T) -> T:
        """Rank 0's `value`, on every rank."""


class AdaPrecController:
    """Chooses the gradients' codec phase by phase; see the module docstring."""

    def __init__(self, candidates: tuple[str, ...], cfg: AdaPrecConfig, run: SpeculativeRun,
                 model: LearningCurveModel | None = None) -> None:
        self.candidates, self.cfg, self.run = candidates, cfg, run
        self.model = model or LearningCurveModel()
        self.current = cfg.first
        self.curve: list[Point] = []
        self.blacklist: list[str] = []
        self.chosen: list[tuple[int, str]] = []
        self.speculation_s = 0.0
        self.decision_s = 0.0
        self.fit_s = 0.0
        self._start = 0.0

    def before_step(self, step: int) -> dict[str, Any] | None:
        """Before step `step` (0-based): the first phase's codec, or a boundary's decision.
        The first call starts the first phase (at step 0, or where a resumed run goes on)."""
        if not self.chosen:
            self._start = time.perf_counter()
            self.run.use(self.current)
            self.run.snapshot()
            self.chosen.append((step, self.current))
            return {"kind": "adaprec", "step": step, "chosen": self.current,
                    "reason": "first phase"}
        cfg = self.cfg
        if step % cfg.phase_steps or step + cfg.speculate_steps > self.run.total_steps:
            return None
        return self._boundary(step)

    def _boundary(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        current = self.run.signal()
        record: dict[str, Any] = {"kind": "adaprec", "step": step, "signal": current}
        if self.curve and collapsed(self.curve[-1][1], current, self.run.chance,
                                    self.cfg.collapse):
            current = self._roll_back(record)
        self.curve.append((step, current))
        if self.speculation_s > self.cfg.overhead_budget * (t0 - self._start):
            self.run.snapshot()
            keep = self._switch(step, self._fallback())
            self.decision_s += time.perf_counter() - t0
            return {**record, "chosen": keep, "reason": "overhead budget spent",
                    "blacklist": list(self.blacklist), "speculation_s": 0.0}
        self.run.snapshot()
        trials = [self._speculate(c, step) for c in self.candidates if c not in self.blacklist]
        self.run.restore()
        t_judge = time.perf_counter()
        at = min(step + self.cfg.phase_steps, self.run.total_steps)
        judged = assess_all(trials, self.curve, at, current, self.run.chance, self.cfg,
                            self.model)
        fit_s = sum(a.prediction.fit_s for a in judged if a.prediction is not None)
        if judged and all(a.blacklisted for a in judged):
            # every candidate fails from here: the run, not the codecs, is unsound; if the
            # last phase made it so, undo that phase as if its collapse had shown already
            if "rolled_back" not in record and self.current != self.cfg.first:
                self.run.drop()
                self.curve[-1] = (step, self._roll_back(record))
            winner = self._fallback()
            reason = "every candidate failed; kept the reference" if "rolled_back" not in \
                record else "every candidate failed; the last phase undone"
        else:
            self.blacklist += [a.trial.candidate for a in judged if a.blacklisted]
            winner = self.run.agree(choose(judged, self._fallback()))
            reason = _reason(judged)
        self._switch(step, winner)
        spent = t_judge - t0
        self.speculation_s += spent
        self.fit_s += fit_s
        self.decision_s += time.perf_counter() - t_judge
        return {**record, "chosen": winner, "reason": reason,
                "predict_at": at, "candidates": {a.trial.candidate: a.record() for a in judged},
                "blacklist": list(self.blacklist), "speculation_s": spent, "fit_s": fit_s}

    def _switch(self, step: int, codec: str) -> str:
        self.run.use(codec)
        self.current = codec
        self.chosen.append((step, codec))
        return codec

    def _speculate(self, candidate: str, step: int) -> Trial:
        """Train `candidate` from the snapshot, measuring the signal `points` times."""
        self.run.restore()
        self.run.use(candidate)
        points: list[Point] = []
        seconds: list[float] = []
        finite = True
        for n in _chunks(self.cfg.speculate_steps, self.cfg.points):
            walls, finite = self.run.train(n)
            seconds += walls
            if not finite:
                break
            points.append((step + len(seconds), self.run.signal()))
        # the median: a codec's first step also builds its all-reduce and checks the peers
        return Trial(candidate, tuple(points), statistics.median(seconds), finite)

    def _roll_back(self, record: dict[str, Any]) -> float:
        """The last phase collapsed the signal: undo it (state back to the boundary before,
        the data position kept) and blacklist its codec (never `first`, the reference: a
        run that collapses in it would with any codec); the signal now."""
        if self.current not in self.blacklist and self.current != self.cfg.first:
            self.blacklist.append(self.current)
        self.run.rollback()
        signal = self.run.signal()
        record.update(rolled_back=self.current, signal=signal)
        return signal

    def _fallback(self) -> str:
        """The codec to keep when no candidate is eligible."""
        return self.current if self.current not in self.blacklist else self.cfg.first

    def summary(self) -> dict[str, Any]:
        """summary.json's `adaprec` figures."""
        return {"candidates": list(self.candidates), "chosen": [list(c) for c in self.chosen],
                "blacklist": list(self.blacklist), "speculation_s": self.speculation_s,
                "fit_s": self.fit_s, "decision_s": self.decision_s}


def _chunks(steps: int, parts: int) -> list[int]:
    """`steps` cut into `parts` nearly equal positive pieces."""
    return [steps * (i + 1) // parts - steps * i // parts for i in range(parts)]


def _reason(judged: list[Assessment]) -> str:
    if not any(a.eligible for a in judged):
        return "no candidate eligible; kept the current codec"
    return "best predicted gain per second" if any(a.eligible and a.gain > 0 for a in judged) \
        else "no candidate gains; best predicted signal"
