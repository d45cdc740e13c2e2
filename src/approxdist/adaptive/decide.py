"""AdaPrec's decision at a phase boundary, as a pure function of what speculation measured.

Seed 004's step (3): continue with the precision that gives the best accuracy gain per
unit of time. First, safety: a candidate whose measured error on the update
(`comm.update_error`: what its codec did to the gradients it sent during its
speculation, error feedback included) exceeds `error_budget` is `damaging` and never
chosen, whatever its step time: the direct, same-batch signal sees what a few steps of
a held-out curve cannot (docs/adaprec.md). Among the safe candidates, `decide = "error"`
(the default) takes the fastest: within the budget their updates are all close to the
exact one, so the progress per step is taken as equal and the gain per second is the
steps per second. With `decide = "curve"` (seed 004's own rule) each candidate's signal
at the next boundary is predicted by the learning-curve model (`learning_curve.py`) from
the run's curve so far followed by the candidate's speculative points (`assess_all`
predicts every candidate in one `predict_many`, their fits sharing arrays); its time to
get there is its measured seconds per step times the phase length. The guards the seed does not discuss:
* a candidate whose speculation produced a non-finite loss or signal (`diverged`) or lost
  more than `collapse` of the signal the run had above chance (`collapsed`) is blacklisted;
* a candidate whose lower confidence bound `mean - lcb_z * std` falls below the current
  signal minus `margin` is not eligible (validation noise on short phases), nor one whose
  last speculative point did (`falling`: a fit over the run's rising curve may not see
  a decline that started at the snapshot; under the error rule relative to the others:
  when every safe candidate fell, the run fell, and those ending within `margin` of the
  best end stay eligible, `fell_alike`; nor is the codec the run held over its last phase
  while the signal rose: its K steps outweigh a dip in its S);
* the prediction is at most the candidate's own pace (`own_pace`): the run's curve so far
  dominates the fit, and a candidate that stalls must not inherit its rise;
* optionally (`gain_share` > 0) a candidate predicted to gain less than that share of the
  best eligible candidate's gain is not eligible (`outgained`): speed may not buy more
  than a bounded loss of progress;
* among eligible candidates with a positive predicted gain the best gain per second wins;
  if none gains, the best predicted signal; if none is eligible, the current codec stays.
  The prediction is at the next boundary, or with `horizon = "run"` at the run's last
  step (the gain per second then over the steps left).
With `choose = "layer"` the winner is one codec per parameter (`per_layer.assign`: the
fewest bits within the error budget, from the safe candidates' per-parameter errors).
Each decision names what decided it (`decided_by`): `error` when the fastest candidate
was kept out by its error, else `time`, `curve` or `layer`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from approxdist.adaptive.learning_curve import LearningCurveModel, Prediction
from approxdist.adaptive.per_layer import assign, mix_spec
from approxdist.comm.update_error import relative
from approxdist.config.adaprec import AdaPrecConfig

#: (step counted from 1, signal) of one measurement
Point = tuple[int, float]


@dataclass(frozen=True)
class Trial:
    """One candidate's speculation: its signal points, seconds per step, finite losses."""

    candidate: str
    points: tuple[Point, ...]
    s_per_step: float
    finite: bool
    #: per parameter (||sent - exact||^2, ||exact||^2, size) over its speculation
    errors: Mapping[str, tuple[float, float, int]] = field(default_factory=dict)

    @property
    def error(self) -> float:
        """The relative error its codec added to the update (0: exact)."""
        return relative(self.errors)


@dataclass(frozen=True)
class Assessment:
    """A trial judged: its prediction at the next boundary, gain per second, verdict."""

    trial: Trial
    prediction: Prediction | None
    gain: float
    score: float
    verdict: str  # eligible | damaging | below-lcb | falling | outgained | diverged | collapsed
    pace: float = math.nan  # `own_pace`, the bound on the prediction

    @property
    def eligible(self) -> bool:
        return self.verdict == "eligible"

    @property
    def blacklisted(self) -> bool:
        return self.verdict in ("diverged", "collapsed")

    def record(self) -> dict[str, object]:
        p = self.prediction
        return {"points": [list(pt) for pt in self.trial.points],
                "s_per_step": self.trial.s_per_step, "finite": self.trial.finite,
                "error": _json(self.trial.error),
                "verdict": self.verdict, "gain": _json(self.gain), "score": _json(self.score),
                "pace": _json(self.pace),
                "prediction": None if p is None else {"mean": _json(p.mean), "std": _json(p.std),
                                                      "method": p.method, "fit_s": p.fit_s}}


def assess(trial: Trial, curve: Sequence[Point], at: int, current: float, chance: float,
           cfg: AdaPrecConfig, model: LearningCurveModel, held: str | None = None
           ) -> Assessment:
    """Judge one trial against the run's `curve` (ending at the boundary, value `current`)."""
    return assess_all([trial], curve, at, current, chance, cfg, model, held)[0]


def assess_all(trials: Sequence[Trial], curve: Sequence[Point], at: int, current: float,
               chance: float, cfg: AdaPrecConfig, model: LearningCurveModel,
               held: str | None = None) -> list[Assessment]:
    """`assess` for each trial; the trials' curves predicted in one `predict_many` (they
    share the run's curve and, when whole, their steps: the fits share their arrays).
    `held`: the codec the run trained its last phase in while the signal rose (the error
    rule does not call its speculation `falling`: K steps of the run outweigh S)."""
    screened = [_screen(t, current, chance, cfg) for t in trials]
    if cfg.decide == "error":  # no curve: the safe candidates compared by their step time
        return fell_alike([a if a is not None else _by_time(t, current, cfg, held)
                           for t, a in zip(trials, screened)], cfg.margin, cfg.first)
    fitted = [t for t, a in zip(trials, screened) if a is None]
    curves = [[*curve, *t.points] for t in fitted]
    preds = iter(model.predict_many([([s for s, _ in c], [v for _, v in c]) for c in curves], at))
    judged = [a if a is not None else _judge(t, next(preds), curve, at, current, cfg)
              for t, a in zip(trials, screened)]
    return outgained(judged, cfg.gain_share)


def fell_alike(judged: Sequence[Assessment], margin: float, exact: str) -> list[Assessment]:
    """The error rule's `falling` guard made relative: when no candidate held the signal
    (every safe one fell below the boundary's signal minus `margin`) and the `exact`
    codec was among them, the run fell, not a codec (the learning rate, the batches), and
    those that ended within `margin` of the best end are eligible again; one that fell
    further than the others stays `falling`, as does any when the exact codec was not
    tried (nothing then says the fall is the run's)."""
    safe = [a for a in judged if a.verdict in ("eligible", "falling")]
    if any(a.eligible for a in safe) or exact not in {a.trial.candidate for a in safe}:
        return list(judged)
    best = max(a.trial.points[-1][1] for a in safe)
    return [replace(a, verdict="eligible") if a.verdict == "falling"
            and a.trial.points[-1][1] >= best - margin else a for a in judged]


def outgained(judged: Sequence[Assessment], share: float) -> list[Assessment]:
    """The accuracy guard: an eligible candidate predicted to gain less than `share` of the
    best eligible candidate's predicted gain is not eligible (`outgained`), however cheap;
    with `share` 0 (or no gain) the judgement is unchanged."""
    best = max((a.gain for a in judged if a.eligible), default=0.0)
    if share <= 0 or best <= 0:
        return list(judged)
    return [replace(a, verdict="outgained") if a.eligible and a.gain < share * best else a
            for a in judged]


def _screen(trial: Trial, current: float, chance: float, cfg: AdaPrecConfig) -> Assessment | None:
    """The verdict of a trial that needs no prediction (diverged, collapsed), else None."""
    values = [v for _, v in trial.points]
    if not trial.finite or not all(math.isfinite(v) for v in values):
        return Assessment(trial, None, -math.inf, -math.inf, "diverged")
    if collapsed(current, values[-1], chance, cfg.collapse):
        return Assessment(trial, None, -math.inf, -math.inf, "collapsed")
    if trial.error > cfg.error_budget:
        return Assessment(trial, None, -math.inf, -math.inf, "damaging")
    return None


def _by_time(trial: Trial, current: float, cfg: AdaPrecConfig, held: str | None) -> Assessment:
    """A safe trial under `decide = "error"`: eligible unless its own points fell (not the
    `held` codec's: the run's last phase in it rose, and a dip over its S speculative
    steps is the run's noise); its score the steps per second (the gain per step taken
    as equal within the budget)."""
    gain = trial.points[-1][1] - current
    fell = trial.points[-1][1] < current - cfg.margin and trial.candidate != held
    verdict = "falling" if fell else "eligible"
    return Assessment(trial, None, gain, -max(trial.s_per_step, 1e-9), verdict)


def _judge(trial: Trial, pred: Prediction, curve: Sequence[Point], at: int, current: float,
           cfg: AdaPrecConfig) -> Assessment:
    """A trial's verdict, gain and score from its prediction."""
    if pred.diverged:
        return Assessment(trial, pred, -math.inf, -math.inf, "diverged")
    pace = own_pace(trial, curve[-1], at)
    mean = min(pred.mean, pace)
    gain = mean - current
    seconds = max(trial.s_per_step, 1e-9) * (at - curve[-1][0])
    if trial.points[-1][1] < current - cfg.margin:  # its own points fell, whatever the fit says
        verdict = "falling"
    else:
        verdict = "eligible" if mean - cfg.lcb_z * pred.std >= current - cfg.margin \
            else "below-lcb"
    return Assessment(trial, pred, gain, gain / seconds, verdict, pace)


@dataclass(frozen=True)
class Decision:
    """A boundary's outcome, all every rank needs: rank 0 computes it (the fits) and the
    others take it (`SpeculativeRun.agree`). `winner` None: every candidate failed."""

    winner: str | None
    reason: str
    blacklisted: tuple[str, ...]
    records: dict[str, dict[str, object]]
    fit_s: float
    decided_by: str = ""


def decide(trials: Sequence[Trial], curve: Sequence[Point], at: int, current: float,
           chance: float, cfg: AdaPrecConfig, model: LearningCurveModel, keep: str,
           bits: Callable[[str], float | None] = lambda c: None,
           held: str | None = None) -> Decision:
    """Judge every trial (`assess_all`, `held` as there) and choose (`choose`; `keep` when
    none is eligible; with `choose = "layer"` a codec per parameter, `bits` giving a
    codec's bits per value)."""
    judged = assess_all(trials, curve, at, current, chance, cfg, model, held)
    fit_s = sum(a.prediction.fit_s for a in judged if a.prediction is not None)
    records = {a.trial.candidate: a.record() for a in judged}
    out = tuple(a.trial.candidate for a in judged if a.blacklisted)
    if judged and all(a.blacklisted for a in judged):
        return Decision(None, "every candidate failed", out, records, fit_s, "blacklist")
    winner = choose(judged, keep, by_score=cfg.decide == "error")
    by = _decided_by(judged, winner, cfg)
    if cfg.choose == "layer" and any(a.eligible for a in judged):
        winner, by = _per_layer(judged, cfg, bits) or winner, "layer"
    return Decision(winner, _reason(judged, cfg), out, records, fit_s, by)


def _per_layer(judged: Sequence[Assessment], cfg: AdaPrecConfig,
               bits: Callable[[str], float | None]) -> str | None:
    """One codec per parameter from the safe trials' errors (None: nothing measured)."""
    safe = {a.trial.candidate: a.trial.errors for a in judged
            if a.verdict in ("eligible", "damaging") and bits(a.trial.candidate) is not None}
    costs = {c: float(bits(c) or 32.0) for c in safe}
    if not any(safe.values()):
        return None
    return mix_spec(assign(safe, costs, cfg.error_budget, exact=cfg.first))


def _decided_by(judged: Sequence[Assessment], winner: str, cfg: AdaPrecConfig) -> str:
    """`error` when the fastest candidate was kept out by its error on the update, else
    what compared the safe ones (`time`, `curve`), or `kept` when none was eligible."""
    timed = [a for a in judged if not a.blacklisted]
    fastest = min(timed, key=lambda a: a.trial.s_per_step) if timed else None
    if fastest is not None and fastest.verdict == "damaging" and winner != fastest.trial.candidate:
        return "error"
    if not any(a.eligible for a in judged):
        return "kept"
    return "time" if cfg.decide == "error" else "curve"


def _reason(judged: Sequence[Assessment], cfg: AdaPrecConfig) -> str:
    if not any(a.eligible for a in judged):
        return "no candidate eligible; kept the current codec"
    if cfg.decide == "error":
        return "fastest within the error budget"
    return "best predicted gain per second" if any(a.eligible and a.gain > 0 for a in judged) \
        else "no candidate gains; best predicted signal"


def collapsed(before: float, after: float, chance: float, share: float) -> bool:
    """Did the signal go from `before` to `after` losing more than `share` of what it had
    above `chance` (or to a non-finite value)?"""
    if not math.isfinite(after):
        return True
    return before > chance and after < chance + (1.0 - share) * (before - chance)


def own_pace(trial: Trial, start: Point, at: int) -> float:
    """The candidate's own speculation extrapolated in a straight line to `at`: on a
    concave learning curve an upper bound, which keeps a fit dominated by the run's
    history from crediting a candidate with progress its own points do not show."""
    (s0, v0), (s1, v1) = start, trial.points[-1]
    return v1 + (v1 - v0) / (s1 - s0) * (at - s1)


def choose(judged: Sequence[Assessment], keep: str, by_score: bool = False) -> str:
    """The winner among `judged` (see the module docstring); `keep` when none is eligible.
    `by_score` (`decide = "error"`): the best score among the eligible, whatever their
    measured gains (within the budget progress per step is taken as equal, so the few
    steps' signal changes are noise; a phase where the signal dips must not hand the
    run to the slowest candidate)."""
    eligible = [a for a in judged if a.eligible]
    if not eligible:
        return keep
    if by_score:
        return max(eligible, key=lambda a: a.score).trial.candidate
    gaining = [a for a in eligible if a.gain > 0]
    if gaining:  # ties go to the earlier candidate
        return max(gaining, key=lambda a: a.score).trial.candidate
    return max(eligible, key=lambda a: a.gain).trial.candidate


def _json(x: float) -> float | None:
    return x if math.isfinite(x) else None
