"""Stage cutting: explicit splits, the balancing solver (vs brute force), stage modules."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from torch import nn

from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.partition import (
    Partition,
    balance_costs,
    param_counts,
    parse_split,
    plan_partition,
    stage_module,
)
from approxdist.pipeline.profiler import profile_times


def _mlp(widths: list[int]) -> nn.Sequential:
    blocks: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:]):
        blocks.append(nn.Sequential(nn.Linear(a, b), nn.ReLU()))
    return nn.Sequential(*blocks)


def test_split_spec() -> None:
    assert parse_split("3", 10).ranges == [(0, 3), (3, 10)]
    assert parse_split("3,7", 10).ranges == [(0, 3), (3, 7), (7, 10)]
    assert parse_split(" 3 , 7 ", 10).boundaries == (3, 7)
    plan = parse_split("1,2", 3)
    assert plan.num_stages == 3 and [plan.stage_of_block(b) for b in range(3)] == [0, 1, 2]
    assert plan.describe() == "stage 0: blocks [0:1]; stage 1: blocks [1:2]; stage 2: blocks [2:3]"


@pytest.mark.parametrize("spec, message", [
    ("10", r"split index 10 out of range for a model of 10 blocks; valid boundaries are 1\.\.9"),
    ("0", r"split index 0 out of range .* 1\.\.9"),
    ("7,3", r"split '7,3' is not increasing \(3 after 7\)"),
    ("3,3", r"not increasing \(3 after 3\)"),
    ("a", r"split 'a' is not a comma-separated list of block indices"),
    ("", r"split '' is not a comma-separated list"),
    ("1,2,3,4,5,6,7,8,9,10", r"11 stages for a model of 10 blocks; use 1\.\.10 stages"),
])
def test_split_errors_name_value_and_range(spec: str, message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        parse_split(spec, 10)


def _brute_force(costs: list[float], p: int) -> float:
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), p - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:])))
    return best


def test_solver_is_exact_against_brute_force() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 9)
        p = rng.randint(1, n)
        costs = [rng.choice([0, 1, 2, 5, 10, 0.5]) for _ in range(n)]
        plan = balance_costs(costs, p)
        assert plan.num_stages == p and plan.num_blocks == n
        worst = max(sum(costs[a:b]) for a, b in plan.ranges)
        assert worst == pytest.approx(_brute_force(costs, p))


def test_solver_known_cases_and_ties() -> None:
    assert balance_costs([1, 1, 1, 1], 2).boundaries == (2,)
    assert balance_costs([4, 1, 1, 1, 1], 2).boundaries == (1,)
    assert balance_costs([1, 2, 3, 4, 5, 6, 7, 8, 9], 3).boundaries == (5, 7)  # 15, 13, 17
    assert balance_costs([10, 0, 10, 0], 2).boundaries == (1,)  # slack goes to later stages
    assert balance_costs([3], 1).boundaries == ()


def test_solver_errors() -> None:
    with pytest.raises(PipelineError, match=r"4 stages for a model of 3 blocks; use 1\.\.3"):
        balance_costs([1, 2, 3], 4)
    with pytest.raises(PipelineError, match=r"0 stages .* use 1\.\.3"):
        balance_costs([1, 2, 3], 0)
    with pytest.raises(PipelineError, match="block cost -1 is not a finite number >= 0"):
        balance_costs([1, -1], 1)
    with pytest.raises(PipelineError, match="nan"):
        balance_costs([float("nan")], 1)


def test_balance_by_params() -> None:
    model = _mlp([4, 64, 64, 4, 4, 4])  # params: 320, 4160, 260, 20, 20
    assert param_counts(model) == [320, 4160, 260, 20, 20]
    plan = plan_partition(model, num_stages=2, balance="params")
    assert plan.ranges == [(0, 1), (1, 5)]  # max(320, 4460) < max(4480, 300)
    plan = plan_partition(model, num_stages=3, balance="params")
    assert max(sum(param_counts(model)[a:b]) for a, b in plan.ranges) == 4160


def test_plan_partition_errors() -> None:
    model = _mlp([4, 4, 4, 4])
    with pytest.raises(PipelineError, match="exactly one of split"):
        plan_partition(model, num_stages=2)
    with pytest.raises(PipelineError, match="exactly one of split"):
        plan_partition(model, split="1", balance="params")
    with pytest.raises(PipelineError, match="unknown balance 'flops'; valid: params, time"):
        plan_partition(model, num_stages=2, balance="flops")
    with pytest.raises(PipelineError, match="makes 2 stages but 3 were asked for"):
        plan_partition(model, num_stages=3, split="1")
    with pytest.raises(PipelineError, match=r"needs num_stages \(1\.\.3\)"):
        plan_partition(model, balance="params")
    with pytest.raises(PipelineError, match=r"one time per block \(3\), got none"):
        plan_partition(model, num_stages=2, balance="time")
    with pytest.raises(PipelineError, match="cannot cut a Linear"):
        plan_partition(nn.Linear(2, 2), split="1")
    with pytest.raises(PipelineError, match=r"4 stages for a model of 3 blocks"):
        plan_partition(model, num_stages=4, balance="params")


def test_balance_by_time_uses_given_times() -> None:
    model = _mlp([4, 4, 4, 4])
    plan = plan_partition(model, num_stages=2, balance="time", block_times=[5.0, 1.0, 1.0])
    assert plan.ranges == [(0, 1), (1, 3)]


def test_profiler_times_each_block_without_side_effects() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 256), nn.BatchNorm1d(256), nn.Linear(256, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    times = profile_times(model, torch.randn(16, 8), repeat=2)
    assert len(times) == 3 and all(t > 0 for t in times)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(PipelineError, match=r"repeat \(0\) must be >= 1"):
        profile_times(model, torch.randn(2, 8), repeat=0)


def test_stage_modules_compose_to_the_model() -> None:
    torch.manual_seed(0)
    model = _mlp([6, 8, 8, 8, 3])
    plan = parse_split("1,3", 4)
    stages = [stage_module(model, plan, s) for s in range(plan.num_stages)]
    assert [len(s) for s in stages] == [1, 2, 1]
    assert list(stages[1]._modules) == ["1", "2"]  # names kept: state_dict keys line up
    assert stages[1][0] is model[1]  # shared, not copied
    x = torch.randn(5, 6)
    y = x
    for stage in stages:
        y = stage(y)
    torch.testing.assert_close(y, model(x))
    with pytest.raises(PipelineError, match=r"stage 3 out of range; valid stages are 0\.\.2"):
        stage_module(model, plan, 3)
    with pytest.raises(PipelineError, match="partition is for 4 blocks but the model has 2"):
        stage_module(_mlp([2, 2, 2]), plan, 0)


def test_partition_object_validates_itself() -> None:
    with pytest.raises(PipelineError, match="out of range"):
        Partition((5,), 5)
