"""Bounded least squares for the separable curve families by variable projection.

Every family in `curves.py` is `u + v * g(x; theta)`: for fixed nonlinear parameters
`theta` (one or two) the linear ones `(u, v)` have a closed-form least-squares solution
(Golub & Pereyra 1973, "The differentiation of pseudo-inverses and nonlinear least squares
problems whose variables separate"). So the fit is
1. a vectorised search: `g` on a whole grid of `theta` (a few hundred rows) in one numpy
   expression, `(u, v)` and the residual for every row in closed form, the best row kept
   (a global start, where a local solver from a guess may stop in a poor basin);
2. a polish of `theta` by damped Newton steps on the projected sum of squares (gradient
   and Hessian by central differences on a stencil, several damping factors tried in one
   vectorised evaluation, `theta` clipped to its bounds, a bound the gradient pushes
   against held), until the sum of squares stops falling;
3. the covariance as `scipy.optimize.curve_fit` reports it: the pseudo-inverse of
   `J^T J` (J the Jacobian of `f` in the family's own parameters at the optimum,
   singular values below `eps * max(J.shape) * s_max` dropped) times `SSR / (n - p)`.

`fit` costs a few numpy calls on arrays of grid x points, about a tenth of a millisecond
per family on the development machine, where `curve_fit` took several milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from approxdist.adaptive.curves import Family, Separable

Array = np.ndarray
#: damping factors (relative to the Hessian's diagonal) tried at once in each Newton step
DAMPING = np.array([0.0, 1e-2, 1e-1, 1.0, 10.0, 1e3])
#: for two nonlinear parameters, Newton steps on the second alone from the grid's best
#: point for each value of the first (the grid is too coarse for a narrow valley); then
#: how many of the best points are polished in every parameter
PROFILE_ITER = 3
STARTS = 3
#: Newton stops when no point's sum of squares fell by more than this share in a step
TOL = 1e-5


@dataclass(frozen=True)
class Fit:
    """A fitted family: its parameters, their covariance, the sum of squared residuals."""

    params: Array
    cov: Array
    ssr: float


def fit(fam: Family, x: Array, y: Array, max_iter: int = 6) -> Fit | None:
    """Least-squares fit of `fam` to (x, y) within its bounds; None if none is finite."""
    sep = fam.sep
    grid = sep.grid()
    phi = _ssr(sep, x, y, grid)
    if len(sep.axes) == 2:  # the best second parameter for each value of the first
        table = phi.reshape(len(sep.axes[0]), len(sep.axes[1]))
        inner = table.argmin(axis=1)
        rows = np.arange(len(table))
        grid, phi = grid.reshape(*table.shape, 2)[rows, inner], table[rows, inner]
        grid, phi = _newton(sep, x, y, grid, phi, np.array([False, True]), PROFILE_ITER)
    starts = np.argsort(phi)[:STARTS]
    if not np.isfinite(phi[starts[0]]):
        return None
    thetas, phi = _newton(sep, x, y, grid[starts], phi[starts], np.ones(len(sep.axes), bool),
                          max_iter)
    theta = thetas[int(np.argmin(phi))]
    u, v, _ = _project(sep, _shapes(sep, x, theta[None]), y)
    params = np.clip(np.array(sep.params(float(u[0]), float(v[0]), theta), dtype=float),
                     fam.lower, fam.upper)
    with np.errstate(over="ignore", invalid="ignore"):
        resid = fam.f(x, *params) - y
    ssr = float(resid @ resid)
    if not np.isfinite(ssr):
        return None
    return Fit(params, covariance(fam, x, params, ssr), ssr)


def _shapes(sep: Separable, x: Array, thetas: Array) -> Array:
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        return sep.shape(x, thetas)


def _project(sep: Separable, g: Array, y: Array) -> tuple[Array, Array, Array]:
    """For each row of `g` (G, n): the least-squares (u, v) and the sum of squares."""
    n = len(y)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        if sep.offset:
            gm = g.sum(axis=1) / n
            gc, yc = g - gm[:, None], y - y.sum() / n
        else:
            gm, gc, yc = np.zeros(len(g)), g, y
        sgg = np.einsum("ij,ij->i", gc, gc)
        usable = np.isfinite(sgg) & (sgg > 1e-300)
        v = np.where(usable, (gc @ yc) / np.where(usable, sgg, 1.0), 0.0)
        if sep.v_min is not None:
            v = np.maximum(v, sep.v_min)
        u = (y.sum() / n - v * gm) if sep.offset else gm
        r = np.where(v[:, None] == 0.0, 0.0, v[:, None] * g) + (u[:, None] - y)
        ssr = np.einsum("ij,ij->i", r, r)
    return u, v, np.where(np.isfinite(ssr), ssr, np.inf)


def _ssr(sep: Separable, x: Array, y: Array, thetas: Array) -> Array:
    """The projected sum of squares for each row of `thetas` (..., q): shape (...)."""
    flat = thetas.reshape(-1, thetas.shape[-1])
    return _project(sep, _shapes(sep, x, flat), y)[2].reshape(thetas.shape[:-1])


#: stencil offsets (in steps h) for one and for two free parameters: the centre, then
#: +-1 along each, then (for two) the four corners
_STENCILS = {1: np.array([[0.0], [1.0], [-1.0]]),
             2: np.array([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0],
                          [1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])}


def _derivatives(phi: Array, h: Array) -> tuple[Array, Array]:
    """Gradient (K, f) and Hessian (K, f, f) of the sum of squares from its values on the
    stencil (K, S) with steps h (K, f)."""
    f = h.shape[1]
    grad = np.stack([(phi[:, 1 + 2 * i] - phi[:, 2 + 2 * i]) / (2 * h[:, i])
                     for i in range(f)], axis=1)
    hess = np.zeros((len(phi), f, f))
    for i in range(f):
        hess[:, i, i] = (phi[:, 1 + 2 * i] - 2 * phi[:, 0] + phi[:, 2 + 2 * i]) / h[:, i] ** 2
    if f == 2:
        hess[:, 0, 1] = hess[:, 1, 0] = (phi[:, 5] - phi[:, 6] - phi[:, 7] + phi[:, 8]) \
            / (4 * h[:, 0] * h[:, 1])
    return grad, hess


def _solve(a: Array, b: Array) -> Array:
    """a^-1 b for stacks of 1x1 or 2x2 systems (..., f, f), (..., f) in closed form
    (a singular system gives a non-finite step, which is never taken)."""
    if a.shape[-1] == 1:
        return b / a[..., 0]
    det = a[..., 0, 0] * a[..., 1, 1] - a[..., 0, 1] * a[..., 1, 0]
    return np.stack([a[..., 1, 1] * b[..., 0] - a[..., 0, 1] * b[..., 1],
                     a[..., 0, 0] * b[..., 1] - a[..., 1, 0] * b[..., 0]], axis=-1) \
        / det[..., None]


def _newton(sep: Separable, x: Array, y: Array, thetas: Array, phi: Array, free: Array,
            max_iter: int) -> tuple[Array, Array]:
    """Damped Newton steps from each row of `thetas` (K, q) at once, moving the `free`
    parameters only; a bound that the gradient pushes against is held. Returns the rows
    and their sums of squares once none improves by more than a relative `TOL`."""
    lo, hi = np.array(sep.lower), np.array(sep.upper)
    stencil = _STENCILS[int(free.sum())]
    thetas, phi = thetas.copy(), phi.copy()
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        for _ in range(max_iter):
            t = thetas[:, free]
            h = 1e-4 * np.maximum(1.0, np.abs(t))
            pts = np.repeat(thetas[:, None, :], len(stencil), axis=1)
            pts[..., free] += stencil[None] * h[:, None, :]
            grad, hess = _derivatives(_ssr(sep, x, y, pts), h)
            held = ((t <= lo[free]) & (grad > 0)) | ((t >= hi[free]) & (grad < 0))
            grad = np.where(held, 0.0, grad)
            hess = np.where(held[:, :, None] | held[:, None, :], 0.0, hess)
            diag = np.abs(np.diagonal(hess, axis1=1, axis2=2)) + np.where(held, 1.0, 0.0)
            hess += np.where(held, 1.0, 0.0)[:, :, None] * np.eye(len(h[0]))
            systems = hess[:, None] + DAMPING[None, :, None, None] * (
                diag[:, None, :, None] * np.eye(len(h[0])))
            steps = np.zeros((*systems.shape[:2], thetas.shape[1]))
            steps[..., free] = _solve(systems, -grad[:, None, :])
            trials = _inside(thetas, steps, lo, hi, free)
            cand = _ssr(sep, x, y, trials)
            cand = np.where(np.isfinite(cand), cand, np.inf)
            best = cand.argmin(axis=1)
            new = cand[np.arange(len(cand)), best]
            better = new < phi
            gain = np.where(better, phi - new, 0.0)
            thetas[better] = trials[better, best[better]]
            phi = np.where(better, new, phi)
            if np.all(gain <= TOL * phi + 1e-30):
                break
    return thetas, phi


def _inside(thetas: Array, steps: Array, lo: Array, hi: Array, free: Array) -> Array:
    """The trial points from each row (K, q): each step (K, L, q) clipped to the bounds,
    each step shortened to end at the first bound it meets (which keeps a step along a
    diagonal valley on it), and each free parameter moved to either bound (where a sum
    of squares that flattens towards a bound has its infimum): (K, 2L + 2f, q)."""
    start = thetas[:, None, :]
    room = np.where(steps > 0, (hi - start) / steps,
                    np.where(steps < 0, (lo - start) / steps, np.inf))
    scale = np.clip(np.nan_to_num(room.min(axis=2, keepdims=True), nan=0.0), 0.0, 1.0)
    index = np.flatnonzero(free)
    jumps = np.repeat(start, 2 * len(index), axis=1)
    for j, i in enumerate(index):
        jumps[:, 2 * j, i], jumps[:, 2 * j + 1, i] = lo[i], hi[i]
    return np.concatenate([np.clip(start + steps, lo, hi),
                           np.clip(start + scale * steps, lo, hi), jumps], axis=1)


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
