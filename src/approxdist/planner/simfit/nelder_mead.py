"""A small Nelder-Mead minimiser on a box (pure; Nelder and Mead, Computer Journal 1965).

The simplex moves by reflection (1), expansion (2), contraction (1/2) and shrink (1/2),
the standard coefficients; every point is clipped into the box [low, high] before it is
evaluated, so the minimum found lies in it. It stops when the simplex's values differ by
less than `ftol` and its points by less than `xtol` (relative to the box), or after
`max_evals` evaluations. No gradient is needed, which suits a cost model whose time is
piecewise linear in its inputs (`max` of overlapping streams).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from approxdist.errors import ConfigError


@dataclass(frozen=True)
class Minimum:
    x: tuple[float, ...]
    value: float
    evals: int


def minimize(f: Callable[[Sequence[float]], float], x0: Sequence[float],
             low: Sequence[float], high: Sequence[float], *, step: float = 0.25,
             ftol: float = 1e-10, xtol: float = 1e-6, max_evals: int = 400) -> Minimum:
    """The smallest `f` found from `x0` inside the box (`step`: the first simplex's edge,
    a share of each side)."""
    n = len(x0)
    if not n or len(low) != n or len(high) != n or any(lo > hi for lo, hi in zip(low, high)):
        raise ConfigError(f"a box of {len(low)} lows and {len(high)} highs (low <= high) for "
                          f"{n} unknowns is needed")

    def clip(x: Sequence[float]) -> list[float]:
        return [min(max(v, lo), hi) for v, lo, hi in zip(x, low, high)]

    evals = 0

    def value(x: list[float]) -> float:
        nonlocal evals
        evals += 1
        return f(x)

    start = clip(x0)
    simplex = [start]
    for i in range(n):
        p = list(start)
        side = (high[i] - low[i]) or 1.0
        p[i] = p[i] + step * side if p[i] + step * side <= high[i] else p[i] - step * side
        simplex.append(clip(p))
    values = [value(p) for p in simplex]
    while evals < max_evals:
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        size = max(abs(a - b) / ((hi - lo) or 1.0) for p in simplex[1:]
                   for a, b, lo, hi in zip(p, simplex[0], low, high))
        if values[-1] - values[0] <= ftol and size <= xtol:
            break
        centre = [sum(p[i] for p in simplex[:-1]) / n for i in range(n)]
        worst = simplex[-1]

        def toward(c: float, centre: list[float] = centre, worst: list[float] = worst
                   ) -> list[float]:
            return clip([m + c * (m - w) for m, w in zip(centre, worst)])

        r = toward(1.0)
        fr = value(r)
        if fr < values[0]:
            e = toward(2.0)
            fe = value(e)
            simplex[-1], values[-1] = (e, fe) if fe < fr else (r, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = r, fr
        else:
            c = toward(0.5) if fr < values[-1] else toward(-0.5)
            fc = value(c)
            if fc < min(fr, values[-1]):
                simplex[-1], values[-1] = c, fc
            else:  # shrink towards the best point
                simplex = [simplex[0]] + [clip([b + 0.5 * (v - b) for v, b in zip(p, simplex[0])])
                                          for p in simplex[1:]]
                values = [values[0]] + [value(p) for p in simplex[1:]]
    best = min(range(n + 1), key=values.__getitem__)
    return Minimum(tuple(simplex[best]), values[best], evals)
