"""Bounded least squares for the separable curve families by variable projection.

Every family in `curves.py` is `u + v * g(x; theta)`: for fixed nonlinear parameters
`theta` (one or two) the linear ones `(u, v)` have a closed-form least-squares solution
(Golub & Pereyra 1973, "The differentiation of pseudo-inverses and nonlinear least squares
problems whose variables separate"). So the fit is
1. a vectorised search: `g` on a whole grid of `theta` in one numpy expression, `(u, v)`
   and the sum of squares for every grid point in closed form (a global start, where a
   local solver from a guess may stop in a poor basin); for two nonlinear parameters,
   a few Newton steps on the second alone from the best grid point of each value of the
   first (the grid is too coarse for a narrow valley);
2. damped Newton steps on the projected sum of squares from the best `STARTS` points
   (gradient and Hessian by central differences on a stencil; several damping factors,
   the steps shortened to the bounds and each parameter moved to either bound all tried
   in one evaluation; a bound the gradient pushes against held), each point until
   its sum of squares falls by less than `TOL` of it in a step, or `max_iter` steps (a
   point's result does not depend on the others fitted with it);
3. the covariance as `scipy.optimize.curve_fit` reports it: the pseudo-inverse of
   `J^T J` (J the Jacobian of `f` in the family's own parameters at the optimum,
   singular values below `eps * max(J.shape) * s_max` dropped) times `SSR / (n - p)`.

`fit_all` fits several families at once and `fit_curves` several curves at the same
steps too (a decision's candidates): their points travel in the same arrays, so a Newton
step costs the same few numpy calls for all of them (one `g` per family). On curves of a
few dozen points numpy's per-call overhead, not the arithmetic, dominates, and the
shared arrays divide it among the fits (docs/adaprec.md has the measurements).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from approxdist.adaptive.curves import Family

Array = np.ndarray
#: damping factors (relative to the Hessian's diagonal) tried at once in each Newton step
DAMPING = np.array([0.0, 1e-2, 1e-1, 1.0, 10.0, 1e3])
#: Newton steps on the second parameter alone (two-parameter families); how many of the
#: best points are then polished in every parameter
PROFILE_ITER = 3
STARTS = 3
#: Newton stops when no point's sum of squares fell by more than this share in a step
TOL = 1e-5
Q = 2  # the most nonlinear parameters of a family: every point has Q coordinates
#: the stencil's offsets (in steps h): the centre, +-1 along each coordinate, the corners
STENCIL = np.array([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0],
                    [1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])


@dataclass(frozen=True)
class Fit:
    """A fitted family: its parameters, their covariance, the sum of squared residuals."""

    params: Array
    cov: Array
    ssr: float


def fit(fam: Family, x: Array, y: Array, max_iter: int = 12) -> Fit | None:
    """Least-squares fit of `fam` to (x, y) within its bounds; None if none is finite."""
    return fit_all([fam], x, y, max_iter)[0]


def fit_all(families: Sequence[Family], x: Array, y: Array,
            max_iter: int = 12) -> list[Fit | None]:
    """`fit` for each family, their points in the same arrays (see the module docstring)."""
    return fit_curves(families, x, np.asarray(y, dtype=float)[None], max_iter)[0]


def fit_curves(families: Sequence[Family], x: Array, ys: Array,
               max_iter: int = 12) -> list[list[Fit | None]]:
    """`fit` for each family and each curve (rows of `ys`, all at the same `x`), all in
    the same arrays: `[curve][family]`. The grid's `g` is computed once per family."""
    blocks = [(f, c) for f in families for c in range(len(ys))]  # family by family
    if not blocks:
        return [[] for _ in ys]
    starts, free = _grid_starts(families, blocks, x, ys)
    points = Points(blocks, [len(t) for t, _ in starts], x, ys)
    thetas, phi = points.newton(np.concatenate([t for t, _ in starts]),
                                np.concatenate([p for _, p in starts]), np.concatenate(free),
                                PROFILE_ITER)
    polish = [np.argsort(phi[a:b])[:STARTS] + a for a, b in zip(points.cut[:-1], points.cut[1:])]
    points = Points(blocks, [len(r) for r in polish], x, ys)
    rows = np.concatenate(polish)
    every = np.repeat([[True, len(f.sep.axes) == 2] for f, _ in blocks],
                      [len(r) for r in polish], axis=0)
    thetas, phi = points.newton(thetas[rows], phi[rows], every, max_iter)
    fits: list[list[Fit | None]] = [[] for _ in ys]
    for (fam, c), a, b in zip(blocks, points.cut[:-1], points.cut[1:]):
        best = a + int(np.argmin(phi[a:b]))
        fits[c].append(_finish(fam, x, ys[c], thetas[best], float(phi[best])))
    return fits


def _grid_starts(families: Sequence[Family], blocks: Sequence[tuple[Family, int]], x: Array,
                 ys: Array) -> tuple[list[tuple[Array, Array]], list[Array]]:
    """Each block's starting points (and their sums of squares) from its family's grid,
    and which of their coordinates the first Newton steps move."""
    grids = {f.name: _pad(f.sep.grid()) for f in families}
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        g = np.concatenate([np.tile(f.sep.shape(x, f.sep.grid()), (len(ys), 1))
                            for f in families])  # `g` does not depend on the curve
    grid_points = Points(blocks, [len(grids[f.name]) for f, _ in blocks], x, ys)
    phi = grid_points.project(g)[2]
    starts, free = [], []
    for (fam, _), a, b in zip(blocks, grid_points.cut[:-1], grid_points.cut[1:]):
        grid, ph = grids[fam.name], phi[a:b]
        if len(fam.sep.axes) == 2:  # the best second parameter for each value of the first
            table = ph.reshape(len(fam.sep.axes[0]), -1)
            rows = np.arange(len(table)) * table.shape[1] + table.argmin(axis=1)
            free.append(np.tile([False, True], (len(rows), 1)))
        else:
            rows = np.argsort(ph)[:STARTS]
            free.append(np.tile([True, False], (len(rows), 1)))
        starts.append((grid[rows], ph[rows]))
    return starts, free


def _pad(grid: Array) -> Array:
    """A grid of one coordinate with a second, unused one (0) so every point has Q."""
    return grid if grid.shape[1] == Q else np.hstack([grid, np.zeros((len(grid), 1))])


def _finish(fam: Family, x: Array, y: Array, theta: Array, phi: float) -> Fit | None:
    """The family's parameters at `theta`, their covariance; None if not finite."""
    if not np.isfinite(phi):
        return None
    pts = Points([(fam, 0)], [1], x, y[None])
    u, v, _ = pts.project(pts.shapes(theta[None, None]))
    params = np.clip(np.array(fam.sep.params(float(u[0]), float(v[0]), theta[:len(fam.sep.axes)]),
                              dtype=float), fam.lower, fam.upper)
    with np.errstate(over="ignore", invalid="ignore"):
        resid = fam.f(x, *params) - y
    ssr = float(resid @ resid)
    if not np.isfinite(ssr):
        return None
    return Fit(params, covariance(fam, x, params, ssr), ssr)


class Points:
    """Points in the families' search spaces, `counts[i]` of them for block `blocks[i]`
    (a family and the row of `ys` it fits), blocks of a family next to each other (rows
    of (K, Q) arrays): their projected sums of squares, and Newton steps."""

    def __init__(self, blocks: Sequence[tuple[Family, int]], counts: Sequence[int], x: Array,
                 ys: Array) -> None:
        self.x = x
        self.cut = np.cumsum([0, *counts])
        each = np.array(counts)
        fams = [f for f, _ in blocks]
        #: (family, first row, end row) of each run of blocks of one family
        self.runs: list[tuple[Family, int, int]] = []
        for f, a, b in zip(fams, self.cut[:-1], self.cut[1:]):
            if self.runs and self.runs[-1][0] is f:
                self.runs[-1] = (f, self.runs[-1][1], int(b))
            else:
                self.runs.append((f, int(a), int(b)))
        self.y = np.repeat(ys[[c for _, c in blocks]], each, axis=0)
        self.offset = np.repeat([f.sep.offset for f in fams], each)
        self.v_min = np.repeat([-np.inf if f.sep.v_min is None else f.sep.v_min
                                for f in fams], each)
        self.lo = np.repeat([_pad(np.array([f.sep.lower]))[0] for f in fams], each, axis=0)
        self.hi = np.repeat([_pad(np.array([f.sep.upper]))[0] for f in fams], each, axis=0)

    def shapes(self, thetas: Array) -> Array:
        """`g` at every x for each point of `thetas` (K, M, Q), family by family: (K*M, n)."""
        m = thetas.shape[1]
        flat = thetas.reshape(-1, Q)
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            return np.concatenate([f.sep.shape(self.x, flat[a * m:b * m, :len(f.sep.axes)])
                                   for f, a, b in self.runs if b > a])

    def project(self, g: Array) -> tuple[Array, Array, Array]:
        """For each row of `g` (K*M, n): the least-squares (u, v), the sum of squares."""
        m = len(g) // max(len(self.offset), 1)
        y = self.y if m == 1 else np.repeat(self.y, m, axis=0)
        offset, v_min = np.repeat(self.offset, m), np.repeat(self.v_min, m)
        n = y.shape[1]
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            y_mean = np.where(offset, y.sum(axis=1) / n, 0.0)
            gm = np.where(offset, g.sum(axis=1) / n, 0.0)
            gc, yc = g - gm[:, None], y - y_mean[:, None]
            sgg = np.einsum("ij,ij->i", gc, gc)
            usable = np.isfinite(sgg) & (sgg > 1e-300)
            v = np.where(usable, np.einsum("ij,ij->i", gc, yc) / np.where(usable, sgg, 1.0), 0.0)
            v = np.maximum(v, v_min)
            u = y_mean - v * gm
            r = np.where(v[:, None] == 0.0, 0.0, v[:, None] * g) + (u[:, None] - y)
            ssr = np.einsum("ij,ij->i", r, r)
        return u, v, np.where(np.isfinite(ssr), ssr, np.inf)

    def ssr(self, thetas: Array) -> Array:
        """The projected sum of squares at each point of `thetas` (K, M, Q): (K, M)."""
        return self.project(self.shapes(thetas))[2].reshape(thetas.shape[:2])

    def newton(self, thetas: Array, phi: Array, free: Array,
               max_iter: int) -> tuple[Array, Array]:
        """Damped Newton steps from each point (K, Q) at once, moving its `free` (K, Q)
        coordinates only; the points and their sums of squares (module docstring)."""
        lo, hi = self.lo, self.hi
        thetas, phi = thetas.copy(), phi.copy()
        active = np.ones(len(phi), bool)  # a point stops once a step gains less than TOL
        eye = np.eye(Q)
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            for _ in range(max_iter):
                h = 1e-4 * np.maximum(1.0, np.abs(thetas))
                grad, hess = _derivatives(
                    self.ssr(thetas[:, None] + STENCIL[None] * (h * free)[:, None]), h)
                held = ~free | ((thetas <= lo) & (grad > 0)) | ((thetas >= hi) & (grad < 0))
                grad = np.where(held, 0.0, grad)
                hess = np.where(held[:, :, None] | held[:, None, :], 0.0, hess) \
                    + held[:, :, None] * eye
                diag = np.abs(np.diagonal(hess, axis1=1, axis2=2))
                systems = hess[:, None] + DAMPING[None, :, None, None] * (diag[:, None, :, None]
                                                                          * eye)
                steps = np.where(held[:, None], 0.0, _solve(systems, -grad[:, None, :]))
                trials = _trials(thetas, steps, lo, hi, free)
                cand = self.ssr(trials)
                best = cand.argmin(axis=1)
                new = cand[np.arange(len(cand)), best]
                better = active & (new < phi)
                active = better & (phi - new > TOL * new + 1e-30)
                thetas[better] = trials[better, best[better]]
                phi = np.where(better, new, phi)
                if not active.any():
                    break
        return thetas, phi


def _derivatives(phi: Array, h: Array) -> tuple[Array, Array]:
    """Gradient (K, Q) and Hessian (K, Q, Q) of the sum of squares from its values on
    STENCIL (K, 9) with steps h (K, Q) (zero along a coordinate the stencil kept)."""
    grad = np.stack([(phi[:, 1] - phi[:, 2]) / (2 * h[:, 0]),
                     (phi[:, 3] - phi[:, 4]) / (2 * h[:, 1])], axis=1)
    hess = np.empty((len(phi), Q, Q))
    hess[:, 0, 0] = (phi[:, 1] - 2 * phi[:, 0] + phi[:, 2]) / h[:, 0] ** 2
    hess[:, 1, 1] = (phi[:, 3] - 2 * phi[:, 0] + phi[:, 4]) / h[:, 1] ** 2
    hess[:, 0, 1] = hess[:, 1, 0] = (phi[:, 5] - phi[:, 6] - phi[:, 7] + phi[:, 8]) \
        / (4 * h[:, 0] * h[:, 1])
    return grad, hess


def _solve(a: Array, b: Array) -> Array:
    """a^-1 b for stacks of 2x2 systems (..., 2, 2), (..., 2) in closed form (a singular
    system gives a non-finite step, which is never taken)."""
    det = a[..., 0, 0] * a[..., 1, 1] - a[..., 0, 1] * a[..., 1, 0]
    return np.stack([a[..., 1, 1] * b[..., 0] - a[..., 0, 1] * b[..., 1],
                     a[..., 0, 0] * b[..., 1] - a[..., 1, 0] * b[..., 0]], axis=-1) \
        / det[..., None]


def _trials(thetas: Array, steps: Array, lo: Array, hi: Array, free: Array) -> Array:
    """The points each Newton step tries from each point (K, Q): each step (K, L, Q)
    clipped to the bounds, each step shortened to end at the first bound it meets (which
    keeps a step along a diagonal valley on it), and each free coordinate moved to either
    bound (where a sum of squares that flattens towards a bound has its infimum)."""
    start, lo3, hi3 = thetas[:, None, :], lo[:, None, :], hi[:, None, :]
    room = np.where(steps > 0, (hi3 - start) / steps,
                    np.where(steps < 0, (lo3 - start) / steps, np.inf))
    scale = np.clip(np.nan_to_num(room.min(axis=2, keepdims=True), nan=0.0), 0.0, 1.0)
    jumps = np.repeat(start, 2 * Q, axis=1)
    for i in range(Q):
        jumps[:, 2 * i, i] = np.where(free[:, i], lo[:, i], thetas[:, i])
        jumps[:, 2 * i + 1, i] = np.where(free[:, i], hi[:, i], thetas[:, i])
    trials = np.concatenate([start + steps, start + scale * steps, jumps], axis=1)
    return np.clip(trials, lo3, hi3)


def jacobian(fam: Family, x: Array, params: Array) -> Array:
    """d f(x) / d params by central differences (one-sided at a bound): (n, p)."""
    lo, hi = np.array(fam.lower), np.array(fam.upper)
    jac = np.empty((len(x), len(params)))
    for i, p in enumerate(params):
        h = 1e-6 * max(1.0, abs(p))
        up, down = params.copy(), params.copy()
        up[i], down[i] = min(p + h, hi[i]), max(p - h, lo[i])
        jac[:, i] = (fam.f(x, *up) - fam.f(x, *down)) / (up[i] - down[i])
    return jac


def covariance(fam: Family, x: Array, params: Array, ssr: float) -> Array:
    """The parameters' covariance as `curve_fit` (absolute_sigma=False) reports it."""
    p = len(params)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        jac = jacobian(fam, x, params)
    if len(x) <= p or not np.all(np.isfinite(jac)):
        return np.full((p, p), np.inf)
    _, s, vt = np.linalg.svd(jac, full_matrices=False)
    keep = s > np.finfo(float).eps * max(jac.shape) * s[0]
    cov = (vt[keep].T / s[keep] ** 2) @ vt[keep]
    return cov * (ssr / (len(x) - p))
