"""Parametric learning-curve families (Domhan, Springenberg & Hutter, IJCAI 2015).

Each family is a saturating, increasing function of the (normalised) step `x > 0`,
with bounds, and an initial guess from the observed points (the start a generic local
solver such as `scipy.optimize.curve_fit` needs; the tests compare with it). The step
axis is normalised by the caller (last observed step = 1), which keeps every family's
parameters of order one whatever the phase length.

Every family is separable: `f = u + v * g(x; theta)` (`u = 0` for `log_power`), linear
in `(u, v)` once the one or two nonlinear parameters `theta` are fixed. `Family.sep`
describes that form for the variable-projection solver (`varpro.py`): `g` evaluated for
a whole grid of `theta` at once, the grid (in the search space: `ln k` for `mmf` and
`janoschek`), its bounds, the sign constraint on `v` and the map back to the parameters.

| family | value at step x | parameters |
|---|---|---|
| `pow3` | c - a x^-alpha | c, a >= 0, alpha >= 0 |
| `log_power` | a / (1 + (x / e^b)^c) | a, b, c <= 0 |
| `exp3` | c - exp(b - a x) | c, a >= 0, b |
| `mmf` | alpha - (alpha - beta) / (1 + (k x)^delta) | alpha, beta, k > 0, delta > 0 |
| `janoschek` | alpha - (alpha - beta) exp(-k x^delta) | alpha, beta, k > 0, delta > 0 |
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Array = np.ndarray
#: (x, y) -> initial parameters
Guess = Callable[[Array, Array], list[float]]
INF = np.inf
LN_K = 13.815510557964274  # ln 1e6


@dataclass(frozen=True)
class Separable:
    """A family as `u + v * g(x; theta)`: what variable projection needs.

    `shape(x, thetas)` is `g` for each row of `thetas` (G, q) at each `x` (n,): (G, n).
    `axes` are the grid's values along each nonlinear parameter (their product is the
    grid), `lower`/`upper` the search space's bounds, `offset` whether `u` is free (else
    0), `v_min` a lower bound on `v` (or None), and `params(u, v, theta)` the family's
    parameters."""

    shape: Callable[[Array, Array], Array]
    axes: tuple[tuple[float, ...], ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    offset: bool
    v_min: float | None
    params: Callable[[float, float, Array], list[float]]

    def grid(self) -> Array:
        """Every combination of the axes' values: (G, q)."""
        mesh = np.meshgrid(*[np.array(a) for a in self.axes], indexing="ij")
        return np.stack([m.ravel() for m in mesh], axis=1)


@dataclass(frozen=True)
class Family:
    """One curve family: `f(x, *params)`, an initial guess from the data, bounds, and its
    separable form."""

    name: str
    f: Callable[..., Array]
    guess: Guess
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    sep: Separable

    @property
    def n_params(self) -> int:
        return len(self.lower)


def _pow3(x: Array, c: float, a: float, alpha: float) -> Array:
    return c - a * np.power(x, -alpha)


def _log_power(x: Array, a: float, b: float, c: float) -> Array:
    return a / (1.0 + np.power(x / np.exp(b), c))


def _exp3(x: Array, c: float, a: float, b: float) -> Array:
    return c - np.exp(b - a * x)


def _mmf(x: Array, alpha: float, beta: float, k: float, delta: float) -> Array:
    return alpha - (alpha - beta) / (1.0 + np.power(k * x, delta))


def _janoschek(x: Array, alpha: float, beta: float, k: float, delta: float) -> Array:
    return alpha - (alpha - beta) * np.exp(-k * np.power(x, delta))


def _rise(y: Array) -> float:
    """How much the curve rose over the observed points (at least a small positive amount)."""
    return max(float(y[-1] - y[0]), 1e-3 * max(1.0, float(np.abs(y).max())))


def _guess_pow3(x: Array, y: Array) -> list[float]:
    return [float(y[-1]) + 0.1 * _rise(y), _rise(y) * float(x[0]) ** 0.5, 0.5]


def _guess_log_power(x: Array, y: Array) -> list[float]:
    return [float(y[-1]) + 0.1 * _rise(y), float(np.log(x[len(x) // 2])), -1.0]


def _guess_exp3(x: Array, y: Array) -> list[float]:
    return [float(y[-1]) + 0.1 * _rise(y), 3.0, float(np.log(_rise(y))) + 3.0 * float(x[0])]


def _guess_mmf(x: Array, y: Array) -> list[float]:
    return [float(y[-1]) + 0.1 * _rise(y), float(y[0]), 1.0 / float(x[len(x) // 2]), 1.0]


def _guess_janoschek(x: Array, y: Array) -> list[float]:
    return [float(y[-1]) + 0.1 * _rise(y), float(y[0]), 1.0, 1.0]


def _axis(lo: float, hi: float, n: int) -> tuple[float, ...]:
    return tuple(float(v) for v in np.linspace(lo, hi, n))


# g for a grid of theta (rows) at every x (columns), theta in the search space: the
# logarithm of each positive nonlinear parameter (of -c for log_power), along which the
# sum of squares' valleys run nearly straight; ln x <= 0 as the last x is 1
def _g_pow3(x: Array, th: Array) -> Array:  # theta = (ln alpha,)
    return -np.exp(-np.exp(th[:, :1]) * np.log(x))


def _g_log_power(x: Array, th: Array) -> Array:  # theta = (b, ln -c)
    return 1.0 / (1.0 + np.exp(-np.exp(th[:, 1:2]) * (np.log(x) - th[:, :1])))


def _g_exp3(x: Array, th: Array) -> Array:  # theta = (ln a,)
    return -np.exp(-np.exp(th[:, :1]) * x)


def _g_mmf(x: Array, th: Array) -> Array:  # theta = (ln k, ln delta)
    return 1.0 / (1.0 + np.exp(np.exp(th[:, 1:2]) * (th[:, :1] + np.log(x))))


def _g_janoschek(x: Array, th: Array) -> Array:  # theta = (ln k, ln delta)
    return np.exp(-np.exp(th[:, :1] + np.exp(th[:, 1:2]) * np.log(x)))


LN_10 = math.log(10.0)
LN_MIN = math.log(1e-3)  # the smallest exponent or rate searched (the bounds allow 0)
_LN_DELTAS = _axis(LN_MIN, LN_10, 22)
FAMILIES: tuple[Family, ...] = (
    Family("pow3", _pow3, _guess_pow3, (-INF, 0.0, 0.0), (INF, INF, 10.0),
           Separable(_g_pow3, ((LN_MIN, *_axis(math.log(0.01), LN_10, 64)),), (LN_MIN,), (LN_10,),
                     True, 0.0, lambda u, v, th: [u, v, math.exp(th[0])])),
    Family("log_power", _log_power, _guess_log_power, (-INF, -20.0, -10.0), (INF, 20.0, 0.0),
           Separable(_g_log_power, ((-20.0, *_axis(-8.0, 8.0, 17), 20.0), _LN_DELTAS), (-20.0, LN_MIN),
                     (20.0, LN_10), False, None,
                     lambda u, v, th: [v, th[0], -math.exp(th[1])])),
    Family("exp3", _exp3, _guess_exp3, (-INF, 0.0, -50.0), (INF, 100.0, 50.0),
           Separable(_g_exp3, ((LN_MIN, *_axis(math.log(0.02), math.log(100.0), 64)),), (LN_MIN,),
                     (math.log(100.0),), True, 0.0,
                     lambda u, v, th: [u, math.exp(th[0]), math.log(max(v, math.exp(-50.0)))])),
    Family("mmf", _mmf, _guess_mmf, (-INF, -INF, 1e-6, 1e-3), (INF, INF, 1e6, 10.0),
           Separable(_g_mmf, (_axis(-LN_K, LN_K, 25), _LN_DELTAS), (-LN_K, LN_MIN),
                     (LN_K, LN_10), True, None,
                     lambda u, v, th: [u, u + v, math.exp(th[0]), math.exp(th[1])])),
    Family("janoschek", _janoschek, _guess_janoschek, (-INF, -INF, 1e-6, 1e-3),
           (INF, INF, 100.0, 10.0),
           Separable(_g_janoschek, (_axis(-LN_K, math.log(100.0), 19), _LN_DELTAS),
                     (-LN_K, LN_MIN), (math.log(100.0), LN_10), True, None,
                     lambda u, v, th: [u, u + v, math.exp(th[0]), math.exp(th[1])])),
)


def family_names() -> list[str]:
    return [f.name for f in FAMILIES]
