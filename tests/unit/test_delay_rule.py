"""The delay rule's pure core (`optim.delay`): the delayed heavy ball's stable range against
its closed forms and a simulation, the rule's momentum, its one line, and the delays each
mode reports (`schedule.program.stage_delays` of the schedule data, `PSMode.delay`)."""

from __future__ import annotations

import math

import pytest
import torch

from approxdist.config.loader import load_config
from approxdist.errors import ConfigError
from approxdist.optim.delay import (
    apply_delay_rule,
    delay_line,
    implicit_momentum,
    rule_momentum,
    stable_rate,
)
from approxdist.param_server.modes import parse_mode
from approxdist.pipeline.schedule.program import stage_delays
from approxdist.pipeline.schedule.registry import build_async_schedule
from approxdist.topology.dealing import Dealing
from approxdist.train.check import check_parts


@pytest.mark.parametrize("b", [0.0, 0.4, 0.9])
def test_without_a_delay_the_range_is_the_heavy_balls(b: float) -> None:
    assert stable_rate(b, 0) == pytest.approx(2 * (1 + b))


@pytest.mark.parametrize("b", [0.0, 0.4, 0.9])
def test_a_one_step_delay_leaves_one_minus_momentum(b: float) -> None:
    # z^2 - (1 + b) z + (b + a): the roots' product b + a reaches 1 first
    assert stable_rate(b, 1) == pytest.approx(1 - b, abs=1e-8)


@pytest.mark.parametrize(("d", "bound"), [(1, 1.0), (2, (math.sqrt(5) - 1) / 2),
                                          (3, 2 * math.sin(math.pi / 14)),
                                          (4, 2 * math.sin(math.pi / 18))])
def test_delayed_gradient_descent_meets_the_sine_bound(d: int, bound: float) -> None:
    # z^(d+1) - z^d + a has a root on the unit circle at a = 2 sin(pi / (2 (2d + 1)))
    assert stable_rate(0.0, d) == pytest.approx(bound, abs=1e-8)


def _grows(rate: float, b: float, d: int, steps: int = 4000) -> bool:
    """x(t+1) = x(t) + b (x(t) - x(t-1)) - rate x(t-d), from x = 1: does it blow up?"""
    xs = [1.0] * (d + 2)
    for _ in range(steps):
        xs.append(xs[-1] + b * (xs[-1] - xs[-2]) - rate * xs[-1 - d])
    return abs(xs[-1]) > 1.0


@pytest.mark.parametrize(("b", "d"), [(0.9, 2), (0.233, 2), (0.5, 3), (0.15, 3)])
def test_the_bound_is_where_the_recurrence_starts_to_grow(b: float, d: int) -> None:
    a = stable_rate(b, d)
    assert not _grows(0.97 * a, b, d) and _grows(1.03 * a, b, d)


def test_the_rule_takes_the_delays_implicit_momentum_off() -> None:
    assert [implicit_momentum(d) for d in range(4)] == [0, 0.5, 2 / 3, 0.75]
    assert rule_momentum(0.9, 1) == pytest.approx(0.4)
    assert rule_momentum(0.9, 2) == pytest.approx(0.9 - 2 / 3)
    assert rule_momentum(0.9, 3) == pytest.approx(0.15)
    assert rule_momentum(0.3, 1) == 0.0          # never below 0
    assert rule_momentum(0.9, 0) == 0.9          # no delay, nothing to take
    assert rule_momentum(0.9, 3, "off") == 0.9
    with pytest.raises(ConfigError, match="optim.delay_rule = 'on' is not one of: auto, off"):
        rule_momentum(0.9, 1, "on")


def test_the_rule_sets_each_group_and_drops_nesterov_at_zero() -> None:
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    sgd = torch.optim.SGD([{"params": [a], "momentum": 0.9},
                           {"params": [b], "momentum": 0.3, "nesterov": True}], lr=0.1)
    apply_delay_rule(sgd, 1)
    assert [g["momentum"] for g in sgd.param_groups] == [pytest.approx(0.4), 0.0]
    assert [g["nesterov"] for g in sgd.param_groups] == [False, False]
    adam = torch.optim.Adam([a], lr=0.1)
    apply_delay_rule(adam, 3)  # no "momentum" key: left as made
    assert adam.param_groups[0]["betas"] == (0.9, 0.999)


def test_one_line_says_what_the_rule_did_or_what_turning_it_off_costs() -> None:
    assert delay_line(0.9, [0, 0], "auto", "on stages 0-1 (1f1b)") is None
    assert delay_line(0.0, [1, 1], "off", "on stages 0-1 (2bw)") is None
    note = delay_line(0.9, [3, 2, 1, 0], "auto", "on stages 0-3 (pipedream)")
    assert note is not None and "\n" not in note
    assert note.startswith("note: gradients arrive 3, 2, 1, 0 steps late on stages 0-3")
    assert "momentum 0.9 as 0.15, 0.233, 0.4, 0.9" in note
    warning = delay_line(0.9, [1, 1], "off", "on stages 0-1 (2bw)")
    assert warning is not None and warning.startswith(
        "warning: momentum 0.9 with gradients 1 step late on stages 0-1 (2bw) is stable only "
        "for lr x curvature < 0.1 (at the delay rule's momentum 0.4: 0.6; without a delay: 3.8)")
    assert "optim.delay_rule=auto" in warning


def test_the_modes_report_the_delay_of_each_optimiser() -> None:
    assert stage_delays(build_async_schedule("2bw", 2, 4, 3)) == [1, 1]
    assert stage_delays(build_async_schedule("pipedream", 4, 4, 2)) == [3, 2, 1, 0]
    # replicas step alike, once per round: stage 0's two replicas step once per two
    # micro-batches, all it has in flight, so its gradients are no longer late
    assert stage_delays(build_async_schedule("pipedream", 2, 4, 2, dealing=Dealing((2, 1)))) \
        == [0, 0]
    assert stage_delays(build_async_schedule("2bw", 2, 4, 3, dealing=Dealing((2, 1)))) == [1, 1]
    assert [parse_mode(m, 3).delay(3) for m in ("sync", "async", "ssp:2", "backup:1")] == \
        [0, 2, 2, 0]


def test_an_unknown_rule_is_refused_before_the_run_in_one_line() -> None:
    cfg = load_config(None, {"train": {"parallel": "pipeline"},
                             "pipeline": {"stages": 2, "schedule": "2bw"},
                             "optim": {"delay_rule": "on"}})
    with pytest.raises(ConfigError) as info:
        check_parts(cfg)
    assert str(info.value) == ("optim.delay_rule = 'on' is not one of: auto, off (auto lowers "
                               "momentum by a gradient delay's implicit momentum)")
