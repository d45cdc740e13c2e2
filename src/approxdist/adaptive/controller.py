"""The AdaPrec controller (seed 004): phases of K steps, speculation, a decision per boundary.

    controller = AdaPrecController(("fp32", "fp8-e5m2", "table4", "table1"), cfg, run)
    record = controller.before_step(step)     # the trainer calls it before every step

The first phase runs `cfg.first` (none when the first boundary is at the run's first step:
`AdaPrecConfig.first_boundary`). At each boundary (every `phase_steps` steps, while a
whole speculation still fits in the run) the controller measures the run's signal,
snapshots the run, and for each candidate neither blacklisted nor resting (found damaging
at the last boundaries: `resting.py`) restores the snapshot, switches the gradients' codecs
to it and trains `speculate_steps` steps, measuring the signal at `points` points, the
seconds per step (slowest rank) and what its codec did to the update
(`SpeculativeRun.update_error`; over `error_budget` after its first chunk it stops), and
keeps its end (the error rule for one codec goes fastest first by the times measured
before and stops at the first safe candidate no other can beat: `_speculate_all`). Rank
0 judges (`decide.py`) and every rank takes its decision; the run switches to the winner
and goes on from the end of its speculation, whose steps become the run's own (`reuse`:
exactly what the run would have computed); otherwise, or where the speculation ran past
the epoch, it restores the snapshot and trains those steps again: a speculation that
diverged leaves no trace. When the signal at a boundary has collapsed since the last one
(`decide.collapsed`), the phase is undone (model, optimiser and residuals of the last
boundary's snapshot; data position and learning rate go on) and its codec blacklisted.
When speculation has taken more than `overhead_budget` of the run's time so far (rank 0's
clock, which every rank follows), the boundary keeps the current codec.

The controller drives a `SpeculativeRun` (the trainer's, `train/speculation.py`); every
rank calls it in step, so every collective inside matches; only rank 0 fits the curves.
Each boundary returns its record for metrics.jsonl (`kind: adaprec`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from approxdist.adaptive.candidates import codec_bits
from approxdist.adaptive.decide import Decision, Point, Trial, assess, collapsed, decide
from approxdist.adaptive.learning_curve import LearningCurveModel
from approxdist.adaptive.resting import Resting, damaging
from approxdist.adaptive.run import SpeculativeRun
from approxdist.comm.update_error import relative
from approxdist.config.adaprec import AdaPrecConfig


@dataclass(frozen=True)
class _Speculation:
    """A candidate's trial, its kept end (None: cannot go on from it), its training seconds."""

    trial: Trial
    kept: Any
    train_s: float


class AdaPrecController:
    """Chooses the gradients' codec phase by phase; see the module docstring."""

    def __init__(self, candidates: tuple[str, ...], cfg: AdaPrecConfig, run: SpeculativeRun,
                 model: LearningCurveModel | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.candidates, self.cfg, self.run, self.clock = candidates, cfg, run, clock
        self.model = model or LearningCurveModel()
        self.current = cfg.first
        self.curve: list[Point] = []
        self.blacklist: list[str] = []
        self.chosen: list[tuple[int, str]] = []
        self.speculation_s = 0.0
        self.decision_s = 0.0
        self.fit_s = 0.0
        self.reused_steps = 0
        #: each candidate's seconds a step, as last measured (the speculation's order)
        self.step_s: dict[str, float] = {}
        self.resting, self.boundaries = Resting(), 0
        self._start = 0.0

    def before_step(self, step: int) -> dict[str, Any] | None:
        """Before step `step` (0-based): the first phase's codec (the first call, at step 0
        or where a resumed run goes on), or a boundary's decision."""
        cfg = self.cfg
        boundary = cfg.is_boundary(step) and step + cfg.speculate_steps <= self.run.total_steps
        if not self.chosen:
            self._start = self.clock()
            self.run.use(self.current)
            self.run.snapshot()
            if not boundary:  # a boundary here decides the first phase itself
                self.chosen.append((step, self.current))
                return {"kind": "adaprec", "step": step, "chosen": self.current,
                        "reason": "first phase"}
        return self._boundary(step) if boundary else None

    def _boundary(self, step: int) -> dict[str, Any]:
        t0 = self.clock()
        self.boundaries += 1
        current = self.run.signal()
        record: dict[str, Any] = {"kind": "adaprec", "step": step, "signal": current}
        if self.curve and collapsed(self.curve[-1][1], current, self.run.chance,
                                    self.cfg.collapse):
            current = self._roll_back(record)
        self.curve.append((step, current))
        # rank 0's clock decides for every rank: each rank's own (under load they differ)
        # could send one rank to speculate while another trains on, and both would hang
        spent_budget = self.run.agree(
            self.speculation_s > self.cfg.overhead_budget * (t0 - self._start)
            if self.run.decides else None)
        if spent_budget:
            self.run.snapshot()
            keep = self._switch(step, self._fallback())
            self.decision_s += self.clock() - t0
            return {**record, "chosen": keep, "reason": "overhead budget spent",
                    "blacklist": list(self.blacklist), "speculation_s": 0.0}
        self.run.snapshot()
        at = self.run.total_steps if self.cfg.horizon == "run" else \
            min(step + self.cfg.phase_steps, self.run.total_steps)
        specs = self._speculate_all(step, at, current)
        t_judge = self.clock()
        decision = self.run.agree(self._decide([s.trial for s in specs.values()], at, current)
                                  if self.run.decides else None)
        assert decision is not None, "rank 0 decides"
        t_done = self.clock()
        won = specs.get(decision.winner or "")
        kept = won.kept if won is not None else None
        if kept is None:
            self.run.restore()
        if decision.winner is None:
            # every candidate fails from here: the run, not the codecs, is unsound; if the
            # last phase made it so, undo that phase as if its collapse had shown already
            if "rolled_back" not in record and self.current != self.cfg.first:
                self.run.drop()
                self.curve[-1] = (step, self._roll_back(record))
            winner = self._fallback()
            reason = "every candidate failed; kept the reference" if "rolled_back" not in \
                record else "every candidate failed; the last phase undone"
        else:
            self.blacklist += [c for c in decision.blacklisted if c not in self.blacklist]
            winner, reason = decision.winner, decision.reason
        self.resting.note(self.boundaries, specs, damaging(
            self.cfg, decision.records, {c: s.trial.errors for c, s in specs.items()}))
        back = {c: step + (b - self.boundaries) * self.cfg.phase_steps
                for c, b in self.resting.resting(self.boundaries).items()}
        self._switch(step, winner, kept)
        # the winner's steps, when kept, are the run's own: not speculation
        reused_s = won.train_s if kept is not None and won is not None else 0.0
        spent = t_judge - t0 - reused_s
        self.speculation_s += spent
        self.fit_s += decision.fit_s
        self.decision_s += self.clock() - t_judge
        self.reused_steps += self.cfg.speculate_steps if kept is not None else 0
        return {**record, "chosen": winner, "reason": reason, "predict_at": at,
                "decided_by": decision.decided_by,
                "candidates": decision.records, "blacklist": list(self.blacklist),
                "skipped": [c for c in self.candidates
                            if c not in specs and c not in self.blacklist and c not in back],
                "resting": back,
                "speculation_s": spent, "fit_s": decision.fit_s,
                "agree_s": t_done - t_judge,
                "reused_steps": self.cfg.speculate_steps if kept is not None else 0,
                "reused_s": reused_s}

    def _speculate_all(self, step: int, at: int, current: float) -> dict[str, _Speculation]:
        """Each candidate's speculation (not the resting ones, nor per parameter the exact
        `first`). Under the error rule for one
        codec, fastest first by the step times measured before (those never measured
        first), stopping at the first safe one all the rest were measured slower than."""
        resting = self.resting.resting(self.boundaries)
        # per parameter the exact codec needs no speculation: its error is 0 everywhere and
        # the choice is by bits (`per_layer.assign` always has it), not by time
        exact = self.cfg.first if self.cfg.choose == "layer" else None
        todo = [c for c in self.candidates
                if c not in self.blacklist and c not in resting and c != exact]
        greedy = self.cfg.decide == "error" and self.cfg.choose == "all"
        if greedy:
            todo.sort(key=lambda c: self.step_s.get(c, -1.0))  # stable: ties keep the order
        specs: dict[str, _Speculation] = {}
        for i, candidate in enumerate(todo):
            spec = specs[candidate] = self._speculate(candidate, step)
            self.step_s[candidate] = spec.trial.s_per_step
            rest = todo[i + 1:]
            if not greedy or not rest or not all(
                    self.step_s.get(c, -1.0) >= spec.trial.s_per_step for c in rest):
                continue
            safe = assess(spec.trial, self.curve, at, current, self.run.chance, self.cfg,
                          self.model, self._held()).eligible if self.run.decides else None
            if self.run.agree(safe):
                break
        return specs

    def _decide(self, trials: list[Trial], at: int, current: float) -> Decision:
        return decide(trials, self.curve, at, current, self.run.chance, self.cfg, self.model,
                      self._fallback(), codec_bits, self._held())

    def _held(self) -> str | None:
        """The codec the run trained its last phase in, if the signal rose over that phase
        (the error rule does not call its speculation `falling`: `decide.assess_all`)."""
        if len(self.curve) < 2 or self.curve[-1][1] < self.curve[-2][1]:
            return None
        return self.current

    def _switch(self, step: int, codec: str, kept: Any = None) -> str:
        self.run.use(codec)
        if kept is not None:  # after `use`: the kept residuals are in the winner's buckets
            self.run.adopt(kept)
        self.current = codec
        self.chosen.append((step, codec))
        return codec

    def _speculate(self, candidate: str, step: int) -> _Speculation:
        """Train `candidate` from the snapshot, measuring the signal `points` times; its end
        kept (`SpeculativeRun.keep`) for the run to go on from if it wins."""
        self.run.restore()
        self.run.use(candidate)
        self.run.watch(True)
        points: list[Point] = []
        seconds: list[float] = []
        finite, whole = True, True
        train_s = 0.0
        n, k = self.cfg.speculate_steps, self.cfg.points  # k nearly equal chunks
        chunks = [n * (i + 1) // k - n * i // k for i in range(k)]
        for i, n in enumerate(chunks):
            t = self.clock()
            walls, finite = self.run.train(n)
            train_s += self.clock() - t
            seconds += walls
            if not finite:
                break
            points.append((step + len(seconds), self.run.signal()))
            if i == 0 and len(chunks) > 1 and \
                    relative(self.run.update_error()) > self.cfg.error_budget:
                whole = False  # damaging already: its other steps would buy nothing
                break
        errors = self.run.update_error()
        self.run.watch(False)
        kept = self.run.keep() if finite and whole and self.cfg.reuse else None
        # the median: a codec's first step also builds its all-reduce and checks the peers
        trial = Trial(candidate, tuple(points), statistics.median(seconds), finite, errors)
        return _Speculation(trial, kept, train_s)

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
                "fit_s": self.fit_s, "decision_s": self.decision_s,
                "reused_steps": self.reused_steps}
