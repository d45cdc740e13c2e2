"""Parametric learning-curve families (Domhan, Springenberg & Hutter, IJCAI 2015).

Each family is a saturating, increasing function of the (normalised) step `x > 0`,
with an initial guess and bounds derived from the observed points, so that
`scipy.optimize.curve_fit` can fit it by bounded least squares. The step axis is
normalised by the caller (last observed step = 1), which keeps every family's
parameters of order one whatever the phase length.

| family | value at step x | parameters |
|---|---|---|
| `pow3` | c - a x^-alpha | c, a >= 0, alpha >= 0 |
| `log_power` | a / (1 + (x / e^b)^c) | a, b, c <= 0 |
| `exp3` | c - exp(b - a x) | c, a >= 0, b |
| `mmf` | alpha - (alpha - beta) / (1 + (k x)^delta) | alpha, beta, k > 0, delta > 0 |
| `janoschek` | alpha - (alpha - beta) exp(-k x^delta) | alpha, beta, k > 0, delta > 0 |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Array = np.ndarray
#: (x, y) -> initial parameters
Guess = Callable[[Array, Array], list[float]]
INF = np.inf


@dataclass(frozen=True)
class Family:
    """One curve family: `f(x, *params)`, an initial guess from the data, and bounds."""

    name: str
    f: Callable[..., Array]
    guess: Guess
    lower: tuple[float, ...]
    upper: tuple[float, ...]

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


FAMILIES: tuple[Family, ...] = (
    Family("pow3", _pow3, _guess_pow3, (-INF, 0.0, 0.0), (INF, INF, 10.0)),
    Family("log_power", _log_power, _guess_log_power, (-INF, -20.0, -10.0), (INF, 20.0, 0.0)),
    Family("exp3", _exp3, _guess_exp3, (-INF, 0.0, -50.0), (INF, 100.0, 50.0)),
    Family("mmf", _mmf, _guess_mmf, (-INF, -INF, 1e-6, 1e-3), (INF, INF, 1e6, 10.0)),
    Family("janoschek", _janoschek, _guess_janoschek, (-INF, -INF, 1e-6, 1e-3),
           (INF, INF, 100.0, 10.0)),
)


def family_names() -> list[str]:
    return [f.name for f in FAMILIES]
