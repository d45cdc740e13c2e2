"""PipeDream's optimizer: the published AlexNet figures, sanity on VGG-16 / ResNet-50, and the DP
against a brute force over every split x replica assignment of small synthetic profiles."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from typing import Any

import pytest

from approxdist.errors import ConfigError
from approxdist.planner.antichains import StateSpace, chain_states, graph_states
from approxdist.planner.pipedream_format import read_graph, read_pipedream_profile
from approxdist.planner.pipedream_optimizer import Level, PipeDreamSettings, optimize
from approxdist.planner.profile import BlockProfile, Profile
from tests.helpers.pipedream import PROFILES, needs_profiles

GB_S = 1e9
Stages = list[tuple[int, int, int]]  # (first block, end block, replicas)


def objective(profile: Profile, stages: Stages, workers: int, bandwidth: float,
              ratio: float | None, memory: float | None) -> float | None:
    """PipeDream's objective written out from its formulas, for a chain of blocks: the slowest
    stage, where stage s on r workers takes (C + 4 (r-1) P / (B r)) / r, and (with a
    compression ratio c) every stage but the first at least 2 A / (B r c) for its input and
    output. With a memory limit, a stage stashes (its stash + P) times ceil(workers after it
    / r), as PipeDream counts; None if some stage does not fit."""
    blocks, slowest, used = profile.blocks, 0.0, 0
    for s, (a, b, r) in enumerate(stages):
        compute = sum(x.fwd_s + x.bwd_s for x in blocks[a:b])
        params = sum(x.param_bytes for x in blocks[a:b])
        used += r
        stash = (sum(x.stash_bytes for x in blocks[a:b]) + params) * math.ceil((workers - used) / r)
        if memory is not None and stash > memory:
            return None
        time = (compute + 4 * (r - 1) * params / (bandwidth * r)) / r
        if ratio is not None and s > 0:
            time = max(time, 2 * blocks[a - 1].out_bytes / (bandwidth * r * ratio))
            if b < len(blocks):
                time = max(time, 2 * blocks[b - 1].out_bytes / (bandwidth * r * ratio))
        slowest = max(slowest, time)
    return slowest


def _compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(b - a for a, b in zip(bounds, bounds[1:]))


def all_plans(blocks: int, workers: int, straight: bool, fewer: bool) -> Iterator[Stages]:
    """Every split of `blocks` into contiguous stages x every replica count per stage."""
    for total in range(1, workers + 1) if fewer else (workers,):
        for count in range(1, min(blocks, total) + 1):
            if straight and count != total:
                continue
            for sizes in _compositions(blocks, count):
                ends = list(itertools.accumulate(sizes))
                for replicas in [(1,) * count] if straight else _compositions(total, count):
                    yield [(end - size, end, r) for size, end, r in zip(sizes, ends, replicas)]


def _random_profile(rng: random.Random, blocks: int, all_weights: bool = False) -> Profile:
    """Blocks of 2-60 ms; half (or all) with up to 60 MB of weights; outputs 4 B to 40 MB."""
    return Profile("synthetic", (8,), 4, 1, "n/a", "n/a", tuple(
        BlockProfile(f"b{i}", rng.uniform(1e-3, 2e-2), rng.uniform(1e-3, 4e-2),
                     rng.choice([rng.randrange(10**5, 4 * 10**7), 4]),
                     rng.choice([rng.randrange(10**5, 6 * 10**7)] + ([] if all_weights else [0])),
                     rng.randrange(10**5, 4 * 10**7)) for i in range(blocks)))


def _plan_of(space: StateSpace, settings: PipeDreamSettings) -> tuple[float, Stages, int]:
    plan = optimize(space, settings)
    return plan.bottleneck_s, [(s.first, s.end, s.replicas) for s in plan.stages], plan.workers_used


CASES = [dict(ratio=None, straight=False), dict(ratio=1.0, straight=False),
         dict(ratio=0.25, straight=False), dict(ratio=1.0, straight=True),
         dict(ratio=None, straight=False, fewer=True), dict(ratio=1.0, straight=False, fewer=True),
         dict(ratio=None, straight=False, memory=True), dict(ratio=1.0, straight=True, memory=True)]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(k for k, v in c.items() if v))
def test_dp_equals_brute_force_minimum(seed: int, case: dict[str, Any]) -> None:
    rng, fewer = random.Random(seed), case.get("fewer", False)
    # with every block holding weights and more workers than blocks, idle workers can pay off
    profile = _random_profile(rng, rng.choice([5, 6]), all_weights=fewer)
    workers = rng.choice([3, 5, 7] if fewer else [2, 3, 4])
    bandwidth = rng.choice([1e8, 1e9, 1e10])
    memory = rng.uniform(2e7, 2e8) if case.get("memory") else None
    n = len(profile.blocks)
    brute = [(value, plan) for plan in all_plans(n, workers, case["straight"], fewer)
             if (value := objective(profile, plan, workers, bandwidth, case["ratio"], memory)) is not None]
    settings = PipeDreamSettings((Level(workers, bandwidth),), case["ratio"], case["straight"],
                                 memory, fewer)
    if not brute:
        with pytest.raises(ConfigError, match="no PipeDream plan"):
            optimize(chain_states(profile), settings)
        return
    best, stages, used = _plan_of(chain_states(profile), settings)
    assert best == pytest.approx(min(value for value, _ in brute), rel=1e-12)
    assert objective(profile, stages, workers, bandwidth, case["ratio"], memory) == \
        pytest.approx(best, rel=1e-12)  # the plan it returns is the one it priced
    assert stages[0][0] == 0 and stages[-1][1] == n and all(
        a[1] == b[0] for a, b in zip(stages, stages[1:]))
    assert used == workers if not fewer else used <= workers


def test_use_fewer_workers_leaves_workers_idle_when_replicas_only_cost() -> None:
    """Two blocks of 1 ms holding 1 GB each: any replica pays seconds of weight sync."""
    blocks = tuple(BlockProfile(f"b{i}", 0.0005, 0.0005, 1000, 10**9, 1000) for i in range(2))
    space = chain_states(Profile("heavy", (1,), 1, None, "n/a", "n/a", blocks))
    exact = optimize(space, PipeDreamSettings((Level(4),)))
    fewer = optimize(space, PipeDreamSettings((Level(4),), use_fewer_workers=True))
    assert exact.workers_used == 4 and exact.bottleneck_s > 100 * fewer.bottleneck_s
    assert [(s.first, s.end, s.replicas) for s in fewer.stages] == [(0, 1, 1), (1, 2, 1)]
    assert fewer.bottleneck_s == pytest.approx(0.001) and fewer.workers_used == 2


# The README's table (PipeDream's own runs): AlexNet, 4 workers, 1 GB/s.
PUBLISHED = [
    ({}, 23.17, [(0, 6, 2), (6, 9, 1), (9, 22, 1)]),
    ({"activation_compression_ratio": 1.0}, 34.22, [(0, 16, 3), (16, 22, 1)]),
    ({"activation_compression_ratio": 1.0, "straight_pipeline": True}, 66.45, None),
]


@needs_profiles
@pytest.mark.parametrize("source", ["graph", "profile"])
@pytest.mark.parametrize("options, published_ms, readme_plan", PUBLISHED,
                         ids=["default", "ratio1", "ratio1-straight"])
def test_alexnet_reproduces_pipedreams_published_figures(
        source: str, options: dict[str, Any], published_ms: float, readme_plan: Stages | None) -> None:
    path = PROFILES / "alexnet.txt"
    profile = read_pipedream_profile(path)
    space = graph_states(read_graph(path)) if source == "graph" else chain_states(profile)
    plan = optimize(space, PipeDreamSettings((Level(4, GB_S),), **options))
    assert abs(plan.bottleneck_s * 1000 - published_ms) < 0.005
    stages = [(s.first, s.end, s.replicas) for s in plan.stages]
    ratio = options.get("activation_compression_ratio")
    assert objective(profile, stages, 4, GB_S, ratio, None) == pytest.approx(plan.bottleneck_s)
    if readme_plan is None:  # straight pipeline: four stages of one worker
        assert [r for _, _, r in stages] == [1, 1, 1, 1]
    else:  # the README's plan is optimal too (for ratio 1 it ties with ours, see docs/planner.md)
        assert objective(profile, readme_plan, 4, GB_S, ratio, None) == pytest.approx(plan.bottleneck_s)
    if not options:
        assert stages == readme_plan
    # state / block s is PipeDream's node s+2 (node1 is the Input, not placed by the optimizer)
    for stage in plan.stages:
        ids = [layer.split()[0] for layer in stage.layers]
        assert ids == [f"node{s + 2}" for s in range(stage.first, stage.end)]


@needs_profiles
@pytest.mark.parametrize("model", ["vgg16", "resnet50"])
@pytest.mark.parametrize("options", [p[0] for p in PUBLISHED], ids=["default", "ratio1", "straight"])
def test_vgg16_and_resnet50_plans_are_sane(model: str, options: dict[str, Any]) -> None:
    graph = read_graph(PROFILES / f"{model}.txt")
    space = graph_states(graph)
    plan = optimize(space, PipeDreamSettings((Level(4, GB_S),), **options))
    assert 0 < plan.bottleneck_s <= plan.single_worker_s
    assert plan.single_worker_s == pytest.approx(
        sum(n.fwd_ms + n.bwd_ms for n in graph.nodes if not n.is_input) / 1000.0)
    assert plan.workers_used == 4
    assert plan.stages[0].first == 0 and plan.stages[-1].end == len(space.states)
    assert all(a.end == b.first for a, b in zip(plan.stages, plan.stages[1:]))
    layers = [layer for stage in plan.stages for layer in stage.layers]
    assert sorted(layers) == sorted(space.layer_order)  # every layer in exactly one stage
    assert sum(s.compute_s for s in plan.stages) == pytest.approx(plan.single_worker_s)


@needs_profiles
def test_resnet50_antichains_find_plans_a_chain_cannot() -> None:
    """The chain of the linearised profile is a subset of the antichain states, so
    (transfers ignored) the graph's optimum is never worse; for 3 workers it is better."""
    path = PROFILES / "resnet50.txt"
    settings = PipeDreamSettings((Level(3, GB_S),))  # 3 workers: a split a chain cannot make
    on_graph = optimize(graph_states(read_graph(path)), settings).bottleneck_s
    on_chain = optimize(chain_states(read_pipedream_profile(path)), settings).bottleneck_s
    assert on_graph < on_chain


@needs_profiles
def test_hierarchy_of_one_wide_level_is_the_flat_optimizer() -> None:
    space = chain_states(read_pipedream_profile(PROFILES / "alexnet.txt"))
    for options in (p[0] for p in PUBLISHED):
        flat = _plan_of(space, PipeDreamSettings((Level(4, GB_S),), **options))
        inner = _plan_of(space, PipeDreamSettings((Level(1, 1e12), Level(4, GB_S)), **options))
        outer = _plan_of(space, PipeDreamSettings((Level(4, GB_S), Level(1, 1e6)), **options))
        assert inner == flat
        assert outer[0] == pytest.approx(flat[0]) and outer[1:] == flat[1:]


def two_level_objective(profile: Profile, top: Stages, inner_workers: int, inner_bw: float,
                        top_bw: float, ratio: float | None, straight: bool) -> float:
    """PipeDream's two-level objective, written out: a top-level stage of blocks [a, b) on R
    servers costs (T + sync) / R, where T is the best inner plan of [a, b) on one server's
    workers (the flat objective, transfers at the inner bandwidth) and sync = 4 (R-1) P /
    (B R) at the top bandwidth, divided by the inner worker count for the first stage only
    (PipeDream divides it in its single-stage case, not when it adds a stage); transfers
    as in the flat objective at the top bandwidth."""
    slowest, n = 0.0, len(profile.blocks)
    for t, (a, b, r) in enumerate(top):
        inner = min(value for plan in all_plans(b - a, inner_workers, straight, False)
                    if (value := objective(profile, [(a + x, a + y, k) for x, y, k in plan],
                                           inner_workers, inner_bw, ratio, None)) is not None)
        params = sum(x.param_bytes for x in profile.blocks[a:b])
        sync = 4 * (r - 1) * params / (top_bw * r) / (inner_workers if t == 0 else 1)
        time = (inner + sync) / r
        if ratio is not None and t > 0:
            time = max(time, 2 * profile.blocks[a - 1].out_bytes / (top_bw * r * ratio))
            if b < n:
                time = max(time, 2 * profile.blocks[b - 1].out_bytes / (top_bw * r * ratio))
        slowest = max(slowest, time)
    return slowest


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ratio, straight", [(None, False), (1.0, False), (1.0, True)])
def test_two_level_dp_equals_brute_force_minimum(seed: int, ratio: float | None, straight: bool) -> None:
    rng = random.Random(100 + seed)
    profile = _random_profile(rng, 5)
    servers = 2 if straight else rng.choice([2, 3])  # a straight 2 x 3 needs 6 blocks
    inner, top = Level(2, rng.choice([1e10, 1e11])), Level(servers, rng.choice([1e8, 1e9]))
    plan = optimize(chain_states(profile), PipeDreamSettings((inner, top), ratio, straight))
    brute = min(two_level_objective(profile, stages, inner.workers, inner.bandwidth, top.bandwidth,
                                    ratio, straight)
                for stages in all_plans(5, top.workers, straight, False)
                if all(b - a >= (inner.workers if straight else 1) for a, b, _ in stages))
    assert plan.bottleneck_s == pytest.approx(brute, rel=1e-12)
    assert plan.workers_used == plan.workers == inner.workers * top.workers
    assert [s.first for s in plan.stages[1:]] == [s.end for s in plan.stages[:-1]]


@needs_profiles
def test_two_level_plan_on_alexnet_uses_every_worker() -> None:
    """4 servers of 2 workers: a top-level stage on R servers, split by the inner level over
    2 workers, gives stages of R x (inner replicas) workers, 8 in all."""
    space = graph_states(read_graph(PROFILES / "alexnet.txt"))
    plan = optimize(space, PipeDreamSettings((Level(2, 25e9), Level(4, GB_S))))
    assert plan.workers == plan.workers_used == 8
    assert plan.stages[0].first == 0 and plan.stages[-1].end == len(space.states)
    params = space.states[-1].param_bytes  # PipeDream's data-parallel baseline, level by level
    inner_dp = (plan.single_worker_s + 4 * 1 * params / (25e9 * 2)) / 2
    assert plan.data_parallel_s == pytest.approx((inner_dp + 4 * 3 * params / (GB_S * 4) / 2) / 4)


@pytest.mark.parametrize("build, message", [
    (lambda: Level(0), r"level workers = 0 must be an integer >= 1"),
    (lambda: Level(2, 0.0), r"level bandwidth = 0\.0 must be a finite number of bytes/s > 0"),
    (lambda: PipeDreamSettings(()), r"levels = \(\) must be a non-empty tuple of Level"),
    (lambda: PipeDreamSettings([Level(2)]), r"levels = \[.*\] must be a non-empty tuple of Level"),
    (lambda: PipeDreamSettings((Level(2),), activation_compression_ratio=0),
     r"activation_compression_ratio = 0 must be a number > 0, or None for off"),
    (lambda: PipeDreamSettings((Level(2),), memory_bytes=-1.0), r"memory_bytes = -1\.0 must be"),
])
def test_bad_settings_name_the_value(build: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build()


def test_impossible_requests_say_why() -> None:
    space = chain_states(_random_profile(random.Random(0), 3))
    with pytest.raises(ConfigError, match=r"no PipeDream plan for 3 state\(s\) on 4 worker\(s\).*"
                                          r"straight pipeline needs at least as many states"):
        optimize(space, PipeDreamSettings((Level(4),), straight_pipeline=True))
    with pytest.raises(ConfigError, match=r"memory_bytes must hold the stashed data"):
        optimize(space, PipeDreamSettings((Level(4),), straight_pipeline=True, memory_bytes=1.0))
