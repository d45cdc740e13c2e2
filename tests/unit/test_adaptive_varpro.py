"""The variable-projection solver (adaptive/varpro.py) against known parameters and against
`scipy.optimize.curve_fit`, the generic bounded least squares it replaces; several curves
predicted (and a decision's trials judged) at once equal them one by one."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.optimize import curve_fit

from approxdist.adaptive import CurveConfig, LearningCurveModel, varpro
from approxdist.adaptive.curves import FAMILIES
from approxdist.adaptive.decide import Trial, assess, assess_all
from approxdist.config.adaprec import AdaPrecConfig
from approxdist.errors import ConfigError

STEPS_40 = np.arange(1, 41, dtype=float)
X = STEPS_40 / 40
#: parameters inside each family's search space, and the relative tolerance they are
#: recovered to from noise-free points
TRUE = {"pow3": ((0.9, 0.1, 0.6), 1e-3), "log_power": ((0.9, -1.5, -1.2), 1e-3),
        "exp3": ((0.8, 4.0, 0.0), 1e-3), "mmf": ((0.85, 0.1, 4.0, 1.5), 1e-2),
        "janoschek": ((0.9, 0.1, 2.0, 0.8), 1e-2)}


def _reference(fam, x, y):
    """curve_fit from the family's own guess, run to convergence: (params, cov, ssr)."""
    lo, hi = np.array(fam.lower), np.array(fam.upper)
    p0 = np.clip(np.array(fam.guess(x, y)), lo + 1e-9, hi - 1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            p, cov = curve_fit(fam.f, x, y, p0=p0, bounds=(lo, hi), max_nfev=20000)
        except RuntimeError:
            return None
    return p, cov, float(np.sum((fam.f(x, *p) - y) ** 2))


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
def test_each_family_recovers_its_own_parameters(fam) -> None:
    params, rtol = TRUE[fam.name]
    y = fam.f(X, *params)
    fit = varpro.fit(fam, X, y, max_iter=20)
    assert fit is not None
    assert fit.ssr < 1e-10, fam.name
    np.testing.assert_allclose(fit.params, params, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
def test_the_optimum_is_curve_fits_or_better_on_random_curves(fam) -> None:
    """Noisy power, exponential and sigmoidal curves of 8 to 40 points: the sum of squares
    is at most curve_fit's plus 1 % (with the model's default Newton steps)."""
    rng = np.random.default_rng(11)
    shapes = (lambda t, a, r: 0.9 - a * t ** -r, lambda t, a, r: 0.85 - a * np.exp(-t * r / 10),
              lambda t, a, r: 0.85 - a / (1 + (t * r / 5) ** 1.5))
    steps_default = CurveConfig().max_iter
    compared = 0
    for trial in range(12):
        n = (8, 12, 40)[trial % 3]
        t = np.sort(rng.choice(np.arange(1, 200), n, replace=False)).astype(float)
        y = shapes[trial % 3](t, rng.uniform(0.3, 0.7), rng.uniform(0.3, 1.5)) \
            + 0.005 * rng.standard_normal(n)
        x = t / t[-1]
        ref = _reference(fam, x, y)
        fit = varpro.fit(fam, x, y, steps_default)
        assert fit is not None
        if ref is None:
            continue
        compared += 1
        assert fit.ssr <= ref[2] * 1.01 + 1e-10, (fam.name, trial, fit.ssr, ref[2])
    assert compared >= 8


def test_the_covariance_is_curve_fits_at_the_same_optimum() -> None:
    """Where both reach one well-conditioned optimum: the same parameters and covariance."""
    rng = np.random.default_rng(2)
    fam = next(f for f in FAMILIES if f.name == "pow3")
    y = 0.9 - 0.5 * (X * 40) ** -0.7 + 0.005 * rng.standard_normal(X.size)
    ref = _reference(fam, X, y)
    assert ref is not None
    fit = varpro.fit(fam, X, y, max_iter=20)
    assert fit is not None
    np.testing.assert_allclose(fit.params, ref[0], rtol=1e-4)
    np.testing.assert_allclose(fit.cov, ref[1], rtol=2e-2)
    assert fit.ssr <= ref[2] * (1 + 1e-9)


def test_fitting_the_families_together_equals_fitting_each_alone() -> None:
    rng = np.random.default_rng(4)
    y = 0.8 - 0.6 * np.exp(-X * 40 / 15) + 0.003 * rng.standard_normal(X.size)
    together = varpro.fit_all(FAMILIES, X, y)
    for fam, fit in zip(FAMILIES, together):
        alone = varpro.fit(fam, X, y)
        assert fit is not None and alone is not None
        np.testing.assert_allclose(fit.params, alone.params, rtol=1e-12, atol=1e-12)
        assert fit.ssr == pytest.approx(alone.ssr, rel=1e-12)


def test_a_curve_no_family_can_take_gives_no_fit() -> None:
    y = np.full(X.size, np.inf)
    assert all(f is None for f in varpro.fit_all(FAMILIES, X, y))
    assert varpro.fit_all([], X, y) == []


def test_newton_steps_are_a_checked_setting() -> None:
    assert CurveConfig(max_iter=0).max_iter == 0  # the grid's best points, unpolished
    with pytest.raises(ConfigError, match="max_iter"):
        CurveConfig(max_iter=-1)


def test_predicting_several_curves_at_once_equals_predicting_each() -> None:
    """A decision's candidates: the run's curve then each candidate's points (same steps),
    plus a curve at other steps, a short one and a diverged one."""
    rng = np.random.default_rng(9)
    run = [(50.0 * k, 0.2 + 0.1 * k) for k in range(1, 4)]
    curves = []
    for rate in (0.004, 0.002, 0.0005, -0.001):
        spec = [(150.0 + s, 0.5 + rate * s + 0.002 * rng.standard_normal()) for s in (1, 2, 4, 5)]
        pts = run + spec
        curves.append(([s for s, _ in pts], [v for _, v in pts]))
    curves.append((list(STEPS_40), list(0.9 - 0.5 * STEPS_40 ** -0.7)))
    curves.append(([1.0, 2.0, 3.0], [0.1, 0.2, 0.3]))
    curves.append(([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [0.1, 0.2, np.nan, 0.3, 0.4, 0.5]))
    model = LearningCurveModel()
    together = model.predict_many(curves, 200)
    assert [p.method for p in together][-2:] == ["short", "diverged"]
    for (steps, values), p in zip(curves, together):
        alone = model.predict(steps, values, 200)
        assert p.method == alone.method
        if p.method == "diverged":
            continue
        assert p.mean == pytest.approx(alone.mean, rel=1e-9, abs=1e-12)
        assert p.std == pytest.approx(alone.std, rel=1e-9, abs=1e-12)
        assert [m.family for m in p.members] == [m.family for m in alone.members]
        assert p.fit_s == together[0].fit_s > 0  # equal shares of the call's time
    assert model.predict_many([], 10) == []


def test_a_decision_judges_its_trials_as_one_by_one() -> None:
    # the seed's rule (decide = curve) is the one that fits learning curves
    cfg = AdaPrecConfig(phase_steps=50, speculate_steps=5, points=4, decide="curve")
    run = [(50, 0.3), (100, 0.42), (150, 0.5)]
    trials = [Trial(name, tuple((150 + s, 0.5 + rate * s) for s in (1, 2, 4, 5)), secs, True)
              for name, rate, secs in (("fp32", 0.004, 0.02), ("table4", 0.003, 0.005),
                                       ("poison", -0.05, 0.003), ("table1", 0.001, 0.003))]
    trials.append(Trial("nan", ((151, 0.5),), 0.003, False))
    model = LearningCurveModel()
    together = assess_all(trials, run, 200, 0.5, 0.1, cfg, model)
    assert (together[2].verdict, together[4].verdict) == ("collapsed", "diverged")
    assert together[0].prediction is not None and together[0].prediction.method == "ensemble"
    for t, a in zip(trials, together):
        alone = assess(t, run, 200, 0.5, 0.1, cfg, model)
        assert (a.verdict, a.trial) == (alone.verdict, alone.trial)
        assert a.gain == pytest.approx(alone.gain, rel=1e-9, abs=1e-12)
        assert a.score == pytest.approx(alone.score, rel=1e-9, abs=1e-12)
