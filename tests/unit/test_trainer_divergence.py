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
    two_bw = {"train": {"parallel": "pipeline"}, "pipeline": {"stages": 2, "schedule": "2bw"}}
    # the delay rule's momentum 0.9 - 1/2 = 0.4: stable for lr h < 1 - 0.4, 2 (1 + 0.4) without
    hint = _delay_hint(load_config(None, two_bw))
    assert "momentum 0.4 and a one-step-late gradient" in hint
    assert "< 0.6, against 2.8 without the delay" in hint
    kept = _delay_hint(load_config(None, {**two_bw, "optim": {"momentum": 0.5,
                                                              "delay_rule": "off"}}))
    assert "momentum 0.5 and" in kept and "< 0.5, against 3 without" in kept
    assert _delay_hint(load_config(None, {"train": {"parallel": "dp"}})) == ""
    flushed = load_config(None, {"train": {"parallel": "pipeline"},
                                 "pipeline": {"stages": 2, "schedule": "1f1b"}})
    assert _delay_hint(flushed) == ""
