"""The learning-curve model (adaptive/learning_curve.py) on synthetic curves with known values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from approxdist.adaptive import CurveConfig, LearningCurveModel
from approxdist.adaptive.curves import FAMILIES
from approxdist.errors import ConfigError

STEPS = np.arange(1, 41, dtype=float)
#: (name, curve, asymptote): one curve of each shape the families describe
CURVES = (
    ("power", lambda t: 0.9 - 0.5 * t ** -0.7, 0.9),
    ("exponential", lambda t: 0.8 - 0.6 * np.exp(-t / 15), 0.8),
    ("sigmoidal", lambda t: 0.85 - 0.7 / (1 + (t / 10) ** 1.5), 0.85),
)


@pytest.mark.parametrize(("name", "curve", "asymptote"), CURVES)
def test_noise_free_curves_are_extrapolated_to_twice_the_horizon(name, curve, asymptote) -> None:
    p = LearningCurveModel().predict(STEPS, curve(STEPS), 80)
    assert p.method == "ensemble"
    assert abs(p.mean - curve(80.0)) < 0.005, name
    assert p.mean <= asymptote + 0.005
    assert math.isclose(sum(m.weight for m in p.members), 1.0)
    assert p.fit_s > 0


@pytest.mark.parametrize(("name", "curve", "asymptote"), CURVES)
def test_noisy_curves_stay_within_their_stated_uncertainty(name, curve, asymptote) -> None:
    rng = np.random.default_rng(7)
    noise = 0.005
    y = curve(STEPS) + noise * rng.standard_normal(STEPS.size)
    p = LearningCurveModel().predict(STEPS, y, 60)
    err = abs(p.mean - curve(60.0))
    assert err < 0.03, name
    assert err < 3 * p.std, (name, err, p.std)
    assert p.std >= 0.5 * noise  # the residual noise is part of the uncertainty
    assert p.lcb(2.0) < p.lcb(1.0) < p.mean


def test_more_noise_means_a_lower_lower_bound() -> None:
    rng = np.random.default_rng(3)
    base = 0.9 - 0.5 * STEPS ** -0.7
    eps = rng.standard_normal(STEPS.size)
    quiet = LearningCurveModel().predict(STEPS, base + 0.002 * eps, 60)
    loud = LearningCurveModel().predict(STEPS, base + 0.03 * eps, 60)
    assert loud.std > quiet.std


def test_every_family_fits_its_own_curve() -> None:
    x = STEPS / STEPS[-1]
    params = {"pow3": (0.9, 0.1, 0.6), "log_power": (0.9, -1.5, -1.2), "exp3": (0.8, 4.0, 0.0),
              "mmf": (0.85, 0.1, 4.0, 1.5), "janoschek": (0.9, 0.1, 2.0, 0.8)}
    for fam in FAMILIES:
        y = fam.f(x, *params[fam.name])
        model = LearningCurveModel(CurveConfig(families=(fam.name,)))
        p = model.predict(STEPS, y, 60)
        assert p.method == "ensemble", fam.name
        assert abs(p.mean - fam.f(np.array([1.5]), *params[fam.name])[0]) < 1e-3, fam.name


def test_short_curves_fall_back_to_the_last_value() -> None:
    p = LearningCurveModel(CurveConfig(short_std=0.04)).predict([1, 2, 3], [0.2, 0.3, 0.35], 10)
    assert (p.method, p.mean, p.std) == ("short", 0.35, 0.04)


def test_flat_curves_predict_their_mean() -> None:
    y = 0.5 + 1e-4 * np.sin(STEPS)
    p = LearningCurveModel().predict(STEPS, y, 80)
    assert p.method == "flat"
    assert p.mean == pytest.approx(float(y.mean()))
    assert p.std >= 1e-3


def test_a_diverged_curve_is_never_chosen() -> None:
    for bad in (math.nan, math.inf):
        y = list(0.9 - 0.5 * STEPS[:10] ** -0.7)
        y[-1] = bad
        p = LearningCurveModel().predict(STEPS[:10], y, 20)
        assert p.diverged and p.method == "diverged"
        assert p.lcb() == -math.inf
        assert math.isnan(p.mean)


def test_a_collapsing_curve_is_extrapolated_downwards() -> None:
    y = np.concatenate([0.2 + 0.02 * STEPS[:20], 0.6 - 0.01 * (STEPS[20:] - 20)])
    p = LearningCurveModel().predict(STEPS, y, 60)
    assert p.method == "trend"
    assert p.mean < y[-1]
    assert p.lcb() < p.mean


def test_predictions_stay_in_the_signal_range() -> None:
    y = np.minimum(0.05 * STEPS, 0.999)
    y[-5:] = [0.99, 0.993, 0.995, 0.997, 0.999]
    p = LearningCurveModel().predict(STEPS, y, 400)
    assert 0.0 <= p.mean <= 1.0
    free = LearningCurveModel(CurveConfig(bounds=None)).predict(STEPS, 2 + 0.01 * STEPS, 80)
    assert free.mean > 2.4  # no clipping without bounds


def test_bad_input_is_one_clear_error() -> None:
    model = LearningCurveModel()
    with pytest.raises(ConfigError, match="strictly increasing"):
        model.predict([1, 3, 2], [0.1, 0.2, 0.3], 5)
    with pytest.raises(ConfigError, match="as many steps"):
        model.predict([1, 2], [0.1], 5)
    with pytest.raises(ConfigError, match="at or after the last point"):
        model.predict([1, 2, 3], [0.1, 0.2, 0.3], 2)
    with pytest.raises(ConfigError, match="use some of"):
        CurveConfig(families=("pow4",))
    with pytest.raises(ConfigError, match="min_points"):
        CurveConfig(min_points=1)
    with pytest.raises(ConfigError, match="low < high"):
        CurveConfig(bounds=(1.0, 0.0))
