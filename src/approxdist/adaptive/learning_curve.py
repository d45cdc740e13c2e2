"""Predict a learning curve's value at a future step, with an uncertainty (seed 004's step 2).

AdaPrec (seed 004) trains each candidate precision for a few steps and predicts its
accuracy at the next phase boundary from the points measured so far. This model is an
ensemble of the parametric families in `curves.py` (Domhan et al. 2015), each fitted by
bounded least squares (variable projection, `varpro.py`: the optimum `curve_fit` reaches,
at a small fraction of its cost) and combined with Akaike weights (AICc; Burnham &
Anderson 2002). The prediction's variance is the weighted sum of each member's
extrapolation variance (delta method on its parameter covariance), the spread
of the members around their mean, and the measurement noise left in the residuals, so
`Prediction.lcb(z)` is a lower confidence bound a controller can guard with.

Curves that cannot be fitted meaningfully take a named fallback (`Prediction.method`):

| method | when | prediction |
|---|---|---|
| `diverged` | a value is NaN or infinite | mean NaN, lower bound -inf (never choose it) |
| `short` | fewer than `min_points` points | last value, std `short_std` |
| `flat` | values span at most `flat_tol` | mean of the values, their std (>= `flat_tol`) |
| `trend` | the recent points decline, or no family fits | straight line through the last half |
| `ensemble` | otherwise | Akaike-weighted families |

Predictions are clipped to `bounds` (the signal's range: [0, 1] for an accuracy or a
mean probability). `Prediction.fit_s` is the model's cost for this prediction: a share of
`predict_many`'s, which fits the families of every curve measured at the same steps (a
decision's candidates) in the same arrays.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from approxdist.adaptive import varpro
from approxdist.adaptive.curves import FAMILIES, Family, family_names
from approxdist.errors import ConfigError


@dataclass(frozen=True)
class CurveConfig:
    """How the model fits; every field has a default that suits a [0, 1] signal."""

    families: tuple[str, ...] = tuple(family_names())
    min_points: int = 5
    flat_tol: float = 1e-3
    short_std: float = 0.05
    bounds: tuple[float, float] | None = (0.0, 1.0)
    max_iter: int = 12

    def __post_init__(self) -> None:
        unknown = [f for f in self.families if f not in family_names()]
        if unknown or not self.families:
            raise ConfigError(f"learning-curve families {list(self.families)}: use some of "
                              f"{', '.join(family_names())}")
        if self.min_points < 2:
            raise ConfigError(f"min_points = {self.min_points} must be >= 2; e.g. 5")
        if self.max_iter < 0:
            raise ConfigError(f"max_iter = {self.max_iter} must be >= 0 (Newton steps per "
                              f"fit; e.g. 12)")
        if self.flat_tol < 0 or self.short_std < 0:
            raise ConfigError(f"flat_tol = {self.flat_tol} and short_std = {self.short_std} "
                              f"must be >= 0")
        if self.bounds is not None and not self.bounds[0] < self.bounds[1]:
            raise ConfigError(f"bounds = {self.bounds} must be (low, high) with low < high")


@dataclass(frozen=True)
class Member:
    """One fitted family: its prediction, extrapolation variance and Akaike weight."""

    family: str
    mean: float
    var: float
    mse: float
    weight: float


@dataclass(frozen=True)
class Prediction:
    """The predicted value at the asked step, its standard deviation and how it was made."""

    mean: float
    std: float
    method: str
    fit_s: float
    members: tuple[Member, ...] = field(default=())

    @property
    def diverged(self) -> bool:
        return self.method == "diverged"

    def lcb(self, z: float = 1.0) -> float:
        """Lower confidence bound `mean - z * std` (-inf for a diverged curve)."""
        return -math.inf if self.diverged else self.mean - z * self.std


#: mean, std, method, members
_Result = tuple[float, float, str, tuple[Member, ...]]


class LearningCurveModel:
    """`predict(steps, values, at)`: the value of the curve at step `at`;
    `predict_many(curves, at)` for several curves at once."""

    def __init__(self, config: CurveConfig | None = None) -> None:
        self.config = config or CurveConfig()
        self._families = [f for f in FAMILIES if f.name in self.config.families]

    def predict(self, steps: Sequence[float], values: Sequence[float], at: float) -> Prediction:
        return self.predict_many([(steps, values)], at)[0]

    def predict_many(self, curves: Sequence[tuple[Sequence[float], Sequence[float]]],
                     at: float) -> list[Prediction]:
        """`predict` for each (steps, values) curve at the same step `at`. The curves
        measured at the same steps (a decision's candidates) have their families fitted in
        the same arrays (`varpro.fit_curves`); each prediction's `fit_s` is an equal share
        of the whole call's time, so they add up to its cost."""
        t0 = time.perf_counter()
        checked = [_check(steps, values, at) for steps, values in curves]
        done: list[_Result | None] = [self._fallback(x, y, a) for x, y, a in checked]
        same_steps: dict[bytes, list[int]] = {}
        for i, (x, _, _) in enumerate(checked):
            if done[i] is None:
                same_steps.setdefault(x.tobytes(), []).append(i)
        for group in same_steps.values():
            x = checked[group[0]][0]
            families = [fam for fam in self._families if len(x) >= fam.n_params + 2]
            fitted = varpro.fit_curves(families, x, np.stack([checked[i][1] for i in group]),
                                       self.config.max_iter)
            for i, fits in zip(group, fitted):
                _, y, at_x = checked[i]
                done[i] = self._ensemble(families, fits, x, y, at_x)
        share = (time.perf_counter() - t0) / max(len(curves), 1)
        return [self._prediction(r, share) for r in done if r is not None]

    def _prediction(self, result: _Result, fit_s: float) -> Prediction:
        mean, std, method, members = result
        if self.config.bounds is not None and math.isfinite(mean):
            mean = float(np.clip(mean, *self.config.bounds))
        return Prediction(mean, std, method, fit_s, members)

    def _fallback(self, x: np.ndarray, y: np.ndarray, at: float) -> _Result | None:
        """The prediction of a curve no family is fitted to (module docstring); None for
        a curve the ensemble takes."""
        cfg = self.config
        if not np.all(np.isfinite(y)):
            return math.nan, math.inf, "diverged", ()
        if len(y) < cfg.min_points:
            return float(y[-1]), cfg.short_std, "short", ()
        if float(np.ptp(y)) <= cfg.flat_tol:
            return float(y.mean()), max(float(y.std()), cfg.flat_tol), "flat", ()
        if _declining(x, y, cfg.flat_tol):
            return (*_trend(x, y, at), "trend", ())
        return None

    def _ensemble(self, families: Sequence[Family], fitted: Sequence[varpro.Fit | None],
                  x: np.ndarray, y: np.ndarray, at: float) -> _Result:
        """The Akaike-weighted families (or the trend if none fits plausibly)."""
        members = self._members(families, fitted, y, at)
        if not members:
            return (*_trend(x, y, at), "trend", ())
        mean = sum(m.weight * m.mean for m in members)
        noise = sum(m.weight * m.mse for m in members)
        var = sum(m.weight * (m.var + (m.mean - mean) ** 2) for m in members) + noise
        return mean, math.sqrt(var), "ensemble", tuple(members)

    def _members(self, families: Sequence[Family], fitted: Sequence[varpro.Fit | None],
                 y: np.ndarray, at: float) -> list[Member]:
        fits = [f for f in (self._member(fam, fit, y, at) for fam, fit in zip(families, fitted))
                if f is not None]
        if not fits:
            return []
        n = len(y)
        aicc = [n * math.log(max(mse, 1e-300)) + 2 * k + 2 * k * (k + 1) / (n - k - 1)
                for _, _, mse, k in fits]
        best = min(aicc)
        raw = [math.exp(-0.5 * (a - best)) for a in aicc]
        total = sum(raw)
        return [Member(name, mean, var, mse * n / (n - k), w / total)
                for (name, (mean, var), mse, k), w in zip(fits, raw)]

    def _member(self, fam: Family, fitted: varpro.Fit | None, y: np.ndarray,
                at: float) -> tuple[str, tuple[float, float], float, int] | None:
        """A fitted family's prediction at `at` and its variance; None if implausible."""
        if fitted is None:
            return None
        with np.errstate(over="ignore", invalid="ignore"):
            pred = float(fam.f(np.array([at]), *fitted.params)[0])
        mse = fitted.ssr / len(y)
        if not (math.isfinite(pred) and math.isfinite(mse) and self._plausible(pred)):
            return None
        var = _delta_var(fam, fitted.params, fitted.cov, at)
        if not math.isfinite(var):
            var = (pred - float(y[-1])) ** 2  # degenerate fit: the whole step ahead is uncertain
        return fam.name, (pred, var), mse, fam.n_params

    def _plausible(self, value: float) -> bool:
        """Inside the signal's range, with a margin of a tenth of it."""
        if self.config.bounds is None:
            return True
        lo, hi = self.config.bounds
        margin = 0.1 * (hi - lo)
        return lo - margin <= value <= hi + margin


def _check(steps: Sequence[float], values: Sequence[float],
           at: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Steps normalised so the last point is at 1, the values, and `at` on that scale."""
    x = np.asarray(steps, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or len(x) == 0:
        raise ConfigError(f"a learning curve needs as many steps ({x.size}) as values ({y.size}), "
                          f"at least one")
    if x[0] <= 0 or np.any(np.diff(x) <= 0):
        raise ConfigError("learning-curve steps must be positive and strictly increasing; "
                          "count steps from 1")
    if not at >= x[-1]:
        raise ConfigError(f"predict at step {at}: ask for a step at or after the last point "
                          f"({x[-1]:g})")
    return x / x[-1], y, float(at / x[-1])


def _delta_var(fam: Family, params: np.ndarray, cov: np.ndarray, at: float) -> float:
    """Variance of `f(at)` from the parameters' covariance (first-order delta method)."""
    if not np.all(np.isfinite(cov)):
        return math.inf
    grad = np.empty(len(params))
    for i, p in enumerate(params):
        h = 1e-6 * max(1.0, abs(p))
        up, down = params.copy(), params.copy()
        up[i], down[i] = p + h, p - h
        grad[i] = (fam.f(np.array([at]), *up)[0] - fam.f(np.array([at]), *down)[0]) / (2 * h)
    return float(max(grad @ cov @ grad, 0.0))


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least-squares line through the last half (>= 3 points): slope, intercept, resid std."""
    k = max(3, len(x) // 2)
    xs, ys = x[-k:], y[-k:]
    slope, intercept = np.polyfit(xs, ys, 1)
    resid = ys - (slope * xs + intercept)
    return float(slope), float(intercept), float(np.sqrt(np.sum(resid ** 2) / max(k - 2, 1)))


def _declining(x: np.ndarray, y: np.ndarray, tol: float) -> bool:
    """The recent points fall by more than twice their noise (and `tol`)."""
    slope, _, noise = _line(x, y)
    k = max(3, len(x) // 2)
    return slope < 0 and -slope * float(x[-1] - x[-k]) > 2 * noise + tol


def _trend(x: np.ndarray, y: np.ndarray, at: float) -> tuple[float, float]:
    """The line's value at `at`; std = its noise plus half the extrapolated change."""
    slope, intercept, noise = _line(x, y)
    mean = slope * at + intercept
    return mean, math.sqrt(noise ** 2 + (0.5 * (mean - float(y[-1]))) ** 2)
