"""Non-negative least squares for the cost model's small fits (2-3 unknowns), exactly.

`nonnegative_lstsq(a, b)` minimises ||a c - b||^2 over c >= 0 by solving every support
(non-empty subset of the columns) by ordinary least squares and keeping the best
non-negative solution; ties go to fewer unknowns, then to the earlier support. With 3
unknowns that is 7 small solves: exact, and simpler to trust than an iterative solver.
Used by the link level's fit (`calibration.fit_level`) and the engines' overhead
(`overhead.fit_linear`).
"""

from __future__ import annotations

import itertools

import numpy as np


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """The best c >= 0 for a c ~ b (None where no support has a non-negative solution)."""
    n = a.shape[1]
    best: tuple[float, int, int, np.ndarray] | None = None
    supports = [s for k in range(1, n + 1) for s in itertools.combinations(range(n), k)]
    for order, support in enumerate(supports):
        cols = a[:, list(support)]
        if np.linalg.matrix_rank(cols) < len(support):
            continue
        sol, *_ = np.linalg.lstsq(cols, b, rcond=None)
        if np.any(sol < 0):
            continue
        coef = np.zeros(n)
        coef[list(support)] = sol
        residual = float(np.sum((a @ coef - b) ** 2))
        key = (round(residual, 12), len(support), order, coef)
        if best is None or key[:3] < best[:3]:
            best = key
    return None if best is None else best[3]
