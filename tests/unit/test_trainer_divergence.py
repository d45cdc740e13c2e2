"""The trainer's divergence rules, without processes: which step counts as diverged, and
the stability note a 2BW run gets."""

from __future__ import annotations

import math

from approxdist.config.loader import load_config
from approxdist.train.trainer import _delay_hint, first_nonfinite


def test_the_first_nan_or_infinite_step_loss_is_the_divergence() -> None:
    assert first_nonfinite([2.0, None, 1.5]) is None  # None: a step that computed no loss
    assert first_nonfinite([2.0, None, math.inf, math.nan]) == 2
    assert first_nonfinite([math.nan]) == 0
    assert first_nonfinite([]) is None


def test_a_2bw_run_is_told_its_stability_bound_and_others_are_not() -> None:
    two_bw = load_config(None, {"train": {"parallel": "pipeline"},
                                "pipeline": {"stages": 2, "schedule": "2bw"},
                                "optim": {"momentum": 0.5}})
    hint = _delay_hint(two_bw)
    assert "one step late" in hint and "1 - momentum = 0.5" in hint
    assert "2 x (1 + momentum) = 3" in hint
    assert _delay_hint(load_config(None, {"train": {"parallel": "dp"}})) == ""
    flushed = load_config(None, {"train": {"parallel": "pipeline"},
                                 "pipeline": {"stages": 2, "schedule": "1f1b"}})
    assert _delay_hint(flushed) == ""
