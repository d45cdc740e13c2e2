"""The planner prices a zero-bubble schedule's split backward from the profile: the profiler
measures each block's I and W, the profile file keeps them, the cost model's I and W are
theirs (the first stage's W the whole backward), the bubble follows ZB-H1's formula, and
`search` picks a zero-bubble schedule where it is cheaper and within the memory."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from approxdist.errors import ConfigError, DataError
from approxdist.pipeline.profiler import measure_blocks
from approxdist.pipeline.schedule import Kind
from approxdist.pipeline.schedule.action import Action
from approxdist.planner.cost import LinkLevel, Network, PipelinePlan, Stage, pipeline_time
from approxdist.planner.cost.pipeline import stage_durations
from approxdist.planner.objective import SolverSettings
from approxdist.planner.profile import (
    BlockProfile,
    Profile,
    from_json,
    median_profile,
    scale_times,
    to_json,
)
from approxdist.planner.search import search

FREE = Network(LinkLevel("intra", 0.0, 0.0))
MIB = 1 << 20


def _profile(p: int, f: float = 1.0, i: float | None = 1.0, w: float | None = 1.0,
             bwd: float = 2.0, stash: int = 0) -> Profile:
    """p blocks of forward f, whole backward bwd, split into I = i and W = w."""
    return Profile("toy", (16,), 4, 1, "test", "test", tuple(
        BlockProfile(f"b{k}", f, bwd, 64, MIB, stash, input_s=i, weight_s=w)
        for k in range(p)))


def _plan(p: int, m: int, schedule: str) -> PipelinePlan:
    return PipelinePlan(tuple(Stage(k, k + 1) for k in range(p)), schedule, m)


@pytest.mark.parametrize("p, m", [(2, 4), (3, 6), (4, 8), (4, 4)])
def test_equal_f_i_w_give_zb_h1_a_third_of_1f1b_bubble(p: int, m: int) -> None:
    """F = I = W: 1F1B's bubble (p-1)/(m+p-1), ZB-H1's (p-1)/(3m+p-1) (Qi et al. 2024)."""
    prof = _profile(p)
    flush = pipeline_time(prof, _plan(p, m, "1f1b"), FREE)
    zb = pipeline_time(prof, _plan(p, m, "zbh1"), FREE)
    assert flush.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    assert zb.bubble_fraction == pytest.approx((p - 1) / (3 * m + p - 1))
    assert zb.makespan_s == pytest.approx(3 * m + p - 1)
    assert flush.makespan_s == pytest.approx(3 * (m + p - 1))


def test_i_and_w_are_the_profiles_and_the_first_stage_runs_its_backward_in_w() -> None:
    prof = _profile(3, f=1.0, i=0.5, w=2.0, bwd=2.2)
    d = stage_durations(prof, _plan(3, 4, "zbh1"), FREE)
    assert d.of(Action(0, Kind.BACKWARD_INPUT, 0)) == 0.0  # its inputs are data
    assert d.of(Action(0, Kind.BACKWARD_WEIGHT, 0)) == pytest.approx(2.2)
    for s in (1, 2):  # the measured halves, whose sum (2.5) exceeds the whole backward
        assert d.of(Action(s, Kind.BACKWARD_INPUT, 0)) == pytest.approx(0.5)
        assert d.of(Action(s, Kind.BACKWARD_WEIGHT, 0)) == pytest.approx(2.0)
        assert d.of(Action(s, Kind.BACKWARD, 0)) == pytest.approx(2.2)
    unknown = stage_durations(_profile(3, i=None, w=None), _plan(3, 4, "zbh1"), FREE)
    assert unknown.of(Action(1, Kind.BACKWARD_INPUT, 0)) == pytest.approx(1.0)  # half each
    assert unknown.of(Action(1, Kind.BACKWARD_WEIGHT, 0)) == pytest.approx(1.0)


def test_a_large_w_favours_zb_h1_and_a_costly_split_does_not() -> None:
    """W is what fills the bubble: with W large and I small ZB-H1 beats 1F1B by more than
    with I large and W small; where splitting costs half a backward more it loses."""
    p, m = 4, 8
    steps = {}
    for name, i, w in (("big W", 0.2, 1.8), ("big I", 1.8, 0.2), ("costly", 1.5, 1.5)):
        prof = _profile(p, i=i, w=w)
        steps[name] = (pipeline_time(prof, _plan(p, m, "zbh1"), FREE).step_s
                       / pipeline_time(prof, _plan(p, m, "1f1b"), FREE).step_s)
    assert steps["big W"] < steps["big I"] < 1.0 < steps["costly"]


def _settings(**kw: object) -> SolverSettings:
    return SolverSettings(**{"world_size": 4, "network": FREE, "stages": 4,  # type: ignore[arg-type]
                             **kw})


def test_search_picks_a_zero_bubble_schedule_where_cheaper_and_within_memory() -> None:
    prof = _profile(4, stash=8 * MIB)
    schedules = ("1f1b", "gpipe", "zbh1", "zbh2")
    free = search(prof, _settings(), schedules, (8,))
    assert free[0].plan.schedule in ("zbh1", "zbh2") and "zbh2" in {r.plan.schedule
                                                                    for r in free}
    # room for 1F1B's activations (4 in flight on stage 0) but not ZB-H2's 7
    limit = 4 * MIB + 5 * 8 * MIB
    ranked = search(prof, _settings(memory_bytes=limit, optimizer="sgd"), schedules, (8,))
    assert ranked[0].plan.schedule == "zbh1"
    assert all(m.total_bytes <= limit for r in ranked for m in r.memory)
    assert "zbh2" not in {r.plan.schedule for r in ranked}
    costly = _profile(4, i=1.5, w=1.5, stash=8 * MIB)
    assert search(costly, _settings(), schedules, (8,))[0].plan.schedule == "1f1b"


def test_zbv_is_refused_by_the_planner_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"schedule 'zbv' places several chunks per rank, .*"
                                          r"plan zbh1 or zbh2, or train zbv directly"):
        _settings(schedule="zbv")


def test_the_profile_file_keeps_the_halves_and_old_files_read_without_them() -> None:
    prof = _profile(2, i=0.25, w=1.5)
    back = from_json(to_json(prof))
    assert back == prof and back.blocks[0].input_s == 0.25
    old = _profile(2, i=None, w=None)
    assert '"input_s"' not in to_json(old) and from_json(to_json(old)) == old
    assert scale_times(prof, 2.0).blocks[1].weight_s == 3.0
    assert median_profile([prof, replace(prof, blocks=tuple(
        replace(b, input_s=0.75) for b in prof.blocks)), prof]).blocks[0].input_s == 0.25
    with pytest.raises(DataError, match=r"block 'x' gives input_s = 1.0 and weight_s = None: "
                                        r"give both halves"):
        BlockProfile("x", 1.0, 2.0, 0, 0, 0, input_s=1.0)


def test_the_profiler_measures_i_and_w_of_every_block() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Linear(64, 4))
    blocks = measure_blocks(model, torch.randn(16, 32), repeat=1, warmup=0)
    assert all(b.split_known for b in blocks)
    assert blocks[1].weight_s == 0.0  # Tanh: nothing to defer
    assert all(b.weight_s is not None and b.weight_s > 0.0 for b in (blocks[0], blocks[2]))
    assert all(p.grad is None for p in model.parameters())  # measured on a copy
    tokens = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 3))
    first = measure_blocks(tokens, torch.randint(0, 10, (4, 5)), repeat=1, warmup=0)[0]
    assert first.input_s == 0.0 and first.weight_s == first.bwd_s  # token ids open stage 0
