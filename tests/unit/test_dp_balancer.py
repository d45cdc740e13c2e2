"""Comm threads: big all-reduces spread over threads (the same on every rank); the GIL switch."""

from __future__ import annotations

from approxdist.data_parallel.threads import Balancer

#: the bench MLP's buckets in forward order: 4.7M, 2.4M and 2.4M weights between biases
MLP = [4718592.0, 1536.0, 2359296.0, 1536.0, 2359296.0, 16906.0]


def test_big_jobs_go_to_different_threads() -> None:
    b = Balancer(2)
    picks = [b.pick(w) for w in MLP]
    assert picks[0] != picks[2], "the two biggest weights queued on one thread"
    assert abs(b.load[0] - b.load[1]) <= max(MLP) / 2
    b = Balancer(3)
    picks = [b.pick(w) for w in MLP]
    assert len({picks[0], picks[2], picks[4]}) == 3


def test_equal_weights_are_round_robin() -> None:
    b = Balancer(3)
    assert [b.pick(1.0) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_the_choice_depends_only_on_the_weights_so_ranks_agree() -> None:
    a, b = Balancer(2), Balancer(2)
    seq = MLP * 3
    assert [a.pick(w) for w in seq] == [b.pick(w) for w in seq]


def test_reset_starts_a_round_afresh() -> None:
    b = Balancer(2)
    first = [b.pick(w) for w in MLP]
    b.reset()
    assert [b.pick(w) for w in MLP] == first


def test_gil_switch_is_only_ever_lowered() -> None:
    import sys

    import pytest

    from approxdist.data_parallel.threads import shorten_gil_switch
    from approxdist.errors import ConfigError

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        shorten_gil_switch(0.5)
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        shorten_gil_switch(2.0)  # never raised again
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        shorten_gil_switch(None)
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        with pytest.raises(ConfigError, match="gil_switch_ms = 0"):
            shorten_gil_switch(0)
    finally:
        sys.setswitchinterval(before)
