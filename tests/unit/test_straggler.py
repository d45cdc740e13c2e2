"""Stragglers: persistent and seeded random delays, and their bad input."""

from __future__ import annotations

import pytest

from approxdist.config.loader import build_config
from approxdist.errors import ConfigError
from approxdist.train.straggler import Stragglers, parse_delay, stragglers_of


def test_delays_parse_with_units() -> None:
    assert parse_delay("100ms", "x") == pytest.approx(0.1)
    assert parse_delay("0.5s", "x") == 0.5 and parse_delay("250us", "x") == pytest.approx(2.5e-4)
    assert parse_delay("2", "x") == 2.0


def test_persistent_straggler_slows_only_its_rank() -> None:
    s = Stragglers.parse(["2:100ms"], world_size=3)
    assert [s.delay(r, 5) for r in range(3)] == [0.0, 0.0, pytest.approx(0.1)]
    assert s and not Stragglers.parse([], 3)


def test_random_stragglers_are_seeded_and_hit_about_p_of_the_steps() -> None:
    s = Stragglers.parse(["random:0.25:10ms"], world_size=4, eligible=[1, 2, 3], seed=7)
    again = Stragglers.parse(["random:0.25:10ms"], world_size=4, eligible=[1, 2, 3], seed=7)
    hits = [s.delay(r, step) > 0 for step in range(400) for r in range(4)]
    assert hits == [again.delay(r, step) > 0 for step in range(400) for r in range(4)]
    assert not any(s.delay(0, step) for step in range(400))  # not eligible
    assert 0.18 < sum(hits) / (400 * 3) < 0.32


@pytest.mark.parametrize("spec,match", [
    ("3:100ms", "rank 3 is not in this run of 3 rank.*0..2"), ("1:fast", "delay 'fast'"),
    ("random:2:1ms", "probability '2'"), ("slow", "is not one of"), ("a:b:c:d", "is not one of")])
def test_bad_stragglers_name_the_value(spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Stragglers.parse([spec], world_size=3)


def test_ps_runs_pick_random_stragglers_among_workers() -> None:
    cfg = build_config({"train": {"parallel": "ps", "world_size": 3,
                                  "stragglers": ["random:1:1ms"]},
                        "data": {"batch_size": 24}, "ps": {"servers": 1, "workers": 2}})
    s = stragglers_of(cfg)
    assert s.delay(0, 0) == 0.0 and s.delay(1, 0) > 0 and s.delay(2, 0) > 0
