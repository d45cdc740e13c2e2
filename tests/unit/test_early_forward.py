"""Seed 001's overtaking and early forward (`cost.early_forward`) against hand-worked steps."""

from __future__ import annotations

import pytest

from approxdist.errors import ConfigError
from approxdist.planner.cost.early_forward import early_forward_period, serve


def test_free_communication_is_forward_plus_backward() -> None:
    assert early_forward_period([1, 2], [3, 4], [((0,), 0.0), ((1,), 0.0)]) == \
        pytest.approx(10.0)


def test_a_slow_link_sets_the_period_whatever_the_compute() -> None:
    """One bucket of 20 s for both blocks: ready when the backward ends (at F + B), the
    next forward waits for it, so the period is F + B + 20 (nothing to overlap it with)."""
    assert early_forward_period([1, 1], [1, 1], [((0, 1), 20.0)]) == pytest.approx(24.0)


def test_early_forward_hides_the_last_layers_all_reduce_under_the_first_forwards() -> None:
    """Block 1 (last in forward, first in backward) has a 5 s all-reduce; block 0's is
    free. Steady state: block 1's gradient, its all-reduce (5 s), its next forward (1 s),
    its backward (1 s) form the cycle: 7 s, with block 0's forward (2 s) and backward (1 s)
    inside the all-reduce; without early forward it would be 2 + 1 + 5 + ... (F + B + 5)."""
    assert early_forward_period([2, 1], [1, 1], [((1,), 5.0), ((0,), 0.0)]) == \
        pytest.approx(7.0)


def test_the_server_lets_a_first_layer_overtake_a_large_one() -> None:
    # a large job (priority 5) from 0 s for 10 s, a small one (priority 0) at 2 s for 1 s
    assert serve([(5, 0.0, 10.0), (0, 2.0, 1.0)]) == [pytest.approx(11.0), pytest.approx(3.0)]


def test_bad_input_names_the_lengths() -> None:
    with pytest.raises(ConfigError, match=r"\(2 and 1\)"):
        early_forward_period([1, 1], [1], [])
