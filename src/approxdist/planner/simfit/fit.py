"""`simulate --fit`: the unmeasured inputs of a `ScalingModel` fitted to observed speed-ups.

The points with N <= `max_nodes` (but those named to `predict`) are *fit points*, the
rest *predicted points*. The named
inputs are moved inside their bands to minimise the sum over fit points of
ln(s_model / s_observed)^2 (`nelder_mead.minimize`; an input whose band starts above 0 is
searched in log space); the others keep their values. Each fitted input's band is
+-2 standard deviations of the linearised fit: with J the derivatives of ln s at the fit
points by the (log) inputs and sigma the fit's rms error (at least `FLOOR`, the share a
published figure is assumed to be off by), the covariance is sigma^2 (J^T J)^-1;
clipped to the input's band. Each point's *fit band* is ln s +- 2 sqrt(g C g^T), g the
derivatives of its ln s by the fitted inputs: the fit's own uncertainty, correlations kept,
the other inputs at their values; its *band* (`ScalingModel.band`) moves every input,
fitted ones over their +-2 sd, independently, so it is wider. Fitting more inputs than
there are fit points is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from approxdist.errors import ConfigError
from approxdist.planner.scaling import Input, ScalingModel
from approxdist.planner.simfit.nelder_mead import minimize
from approxdist.planner.simfit.points import Point

#: the relative error each observed speed-up is assumed to carry at least (assumed)
FLOOR = 0.03
#: the inputs `simulate --fit` fits unless told
DEFAULT_FREE = ("bandwidth_scale", "jitter")
#: Nelder-Mead's evaluations at most (each prices every fit point once)
MAX_EVALS = 200
#: a step of the coordinates (in [0, 1]) for the derivatives
STEP = 1e-3


@dataclass(frozen=True)
class Fitted:
    """The model with its fitted inputs, and each point's prediction."""

    model: ScalingModel
    free: tuple[str, ...]
    rows: tuple[dict[str, float | str], ...]
    rms: float
    evals: int


class _Coords:
    """Each free input as a coordinate in [0, 1]: log-spaced where its band starts above 0."""

    def __init__(self, inputs: Sequence[Input]) -> None:
        self.inputs = list(inputs)

    def value(self, i: Input, u: float) -> float:
        if i.low > 0:
            return math.exp(math.log(i.low) + u * (math.log(i.high) - math.log(i.low)))
        return i.low + u * (i.high - i.low)

    def coord(self, i: Input, x: float) -> float:
        if i.high == i.low:
            return 0.0
        if i.low > 0:
            return (math.log(x) - math.log(i.low)) / (math.log(i.high) - math.log(i.low))
        return (x - i.low) / (i.high - i.low)

    def values(self, u: Sequence[float]) -> dict[str, float]:
        return {i.name: self.value(i, x) for i, x in zip(self.inputs, u)}


def fit(model: ScalingModel, points: Sequence[Point], free: Sequence[str],
        max_nodes: int, predict: Sequence[tuple[int, int]] = ()) -> Fitted:
    """Fit the inputs named in `free` on the points with N <= `max_nodes` but those whose
    (N, b) is in `predict`."""
    known = {i.name: i for i in model.inputs}
    unknown = [n for n in free if n not in known]
    if unknown:
        raise ConfigError(f"--fit {unknown[0]!r} is not an input; fit some of "
                          f"{', '.join(known)}")
    fixed = [n for n in free if known[n].low == known[n].high]
    if fixed:
        raise ConfigError(f"--fit {fixed[0]}: its band is one value ({known[fixed[0]].low:g}); "
                          f"give it a range to fit in, e.g. --{fixed[0].replace('_', '-')} "
                          f"V,LOW,HIGH")
    def fitted_on(p: Point) -> bool:
        return p.nodes <= max_nodes and (p.nodes, p.per_node_batch) not in predict

    fitting = [p for p in points if fitted_on(p)]
    if len(fitting) < len(free):
        raise ConfigError(f"fitting {len(free)} inputs ({', '.join(free)}) on {len(fitting)} "
                          f"point(s) with N <= {max_nodes}: give at least {len(free)} points "
                          f"or fit fewer inputs (--fit {','.join(free[:len(fitting)]) or 'NAME'})")
    coords = _Coords([known[n] for n in free])

    def residuals(u: Sequence[float]) -> list[float]:
        v = coords.values(u)
        return [math.log(model.speedup(p.nodes, p.per_node_batch, v) / p.speedup)
                for p in fitting]

    best = minimize(lambda u: sum(r * r for r in residuals(u)),
                    [coords.coord(known[n], known[n].value) for n in free],
                    [0.0] * len(free), [1.0] * len(free), max_evals=MAX_EVALS, ftol=1e-9)
    res = residuals(best.x)
    rms = math.sqrt(sum(r * r for r in res) / len(res))
    jac = _jacobian(residuals, best.x)
    cov = max(rms, FLOOR) ** 2 * np.linalg.pinv(jac.T @ jac)
    bands = [(max(0.0, x - 2 * float(sd)), min(1.0, x + 2 * float(sd)))
             for x, sd in zip(best.x, np.sqrt(np.clip(np.diag(cov), 0.0, None)))]
    inputs = {}
    for i, u, (lo, hi) in zip(coords.inputs, best.x, bands):
        inputs[i.name] = Input(i.name, coords.value(i, u), coords.value(i, lo),
                               coords.value(i, hi), "fitted",
                               f"fit on {len(fitting)} points with N <= {max_nodes}, band +-2 sd")
    fitted = model.with_inputs(inputs)
    rows = []
    for p in points:
        def ln_s(u: Sequence[float], p: Point = p) -> list[float]:
            return [math.log(model.speedup(p.nodes, p.per_node_batch, coords.values(u)))]

        g = _jacobian(ln_s, best.x)[0]
        spread = 2 * math.sqrt(max(float(g @ cov @ g), 0.0))
        rows.append(_row(fitted, p, "fit" if fitted_on(p) else "predicted", spread))
    return Fitted(fitted, tuple(free), tuple(rows), rms, best.evals)


def _jacobian(f: Callable[[Sequence[float]], list[float]], u: Sequence[float]) -> np.ndarray:
    """d f / d u by forward differences of `STEP` (backward at the box's edge)."""
    base = np.array(f(u))
    cols = []
    for k in range(len(u)):
        moved = list(u)
        moved[k] = u[k] + STEP if u[k] + STEP <= 1 else u[k] - STEP
        cols.append((np.array(f(moved)) - base) / (moved[k] - u[k]))
    return np.stack(cols, axis=1)


def _row(model: ScalingModel, p: Point, role: str, spread: float) -> dict[str, float | str]:
    s = model.speedup(p.nodes, p.per_node_batch)
    low, high = (float(x) for x in model.band(p.nodes, p.per_node_batch))
    return {"role": role, "nodes": p.nodes, "per_node_batch": p.per_node_batch,
            "observed": p.speedup, "speedup": s, "fit_low": s * math.exp(-spread),
            "fit_high": s * math.exp(spread), "speedup_low": low, "speedup_high": high,
            "error": s / p.speedup - 1}
