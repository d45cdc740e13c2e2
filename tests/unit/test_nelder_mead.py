"""The pure Nelder-Mead minimiser (`planner.simfit.nelder_mead`) on functions with known minima."""

from __future__ import annotations

import pytest

from approxdist.errors import ConfigError
from approxdist.planner.simfit.nelder_mead import minimize


def test_rosenbrock_minimum_at_one_one() -> None:
    m = minimize(lambda x: (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2, [-1.2, 1.0],
                 [-2, -2], [2, 2], max_evals=2000, xtol=1e-9)
    assert m.x == pytest.approx((1.0, 1.0), abs=1e-4) and m.value < 1e-8


def test_a_minimum_outside_the_box_lands_on_its_edge() -> None:
    m = minimize(lambda x: (x[0] - 5) ** 2 + (x[1] + 1) ** 2, [0.5, 0.5], [0, 0], [1, 1])
    assert m.x == pytest.approx((1.0, 0.0), abs=1e-5)


def test_piecewise_linear_and_one_dimensional() -> None:
    m = minimize(lambda x: max(3 - x[0], 2 * x[0] - 3), [0.0], [0.0], [10.0])
    assert m.x[0] == pytest.approx(2.0, abs=1e-5)


def test_a_box_that_does_not_match_the_unknowns() -> None:
    with pytest.raises(ConfigError, match="a box of 1 lows and 2 highs"):
        minimize(lambda x: 0.0, [0.0, 0.0], [0.0], [1.0, 1.0])
