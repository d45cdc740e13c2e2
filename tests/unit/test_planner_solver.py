"""The partition solver: its DP against a brute force, its objective against hand-computed
values and the schedule simulator, its memory rule against `stage_memory`, and bad input."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator

import pytest

from approxdist.errors import ConfigError
from approxdist.planner.cost import (
    CodecCost,
    LinkLevel,
    Network,
    PipelinePlan,
    Stage,
    pipeline_time,
    stage_memory,
)
from approxdist.planner.objective import SolverSettings, estimate, in_flight, stage_bytes
from approxdist.planner.profile import BlockProfile, Profile
from approxdist.planner.solver import solve

MB = 1 << 20


def profile_of(times: list[tuple[float, float]], out: list[int], params: list[int],
               stash: list[int] | None = None, acc: list[float] | None = None) -> Profile:
    stash = stash or [0] * len(times)
    acc = acc or [0.0] * len(times)
    blocks = tuple(BlockProfile(f"b{i}", f, b, o, p, s, a)
                   for i, ((f, b), o, p, s, a) in enumerate(zip(times, out, params, stash, acc)))
    return Profile("toy", (4,), 8, 1, "test", "test", blocks)


def random_profile(rng: random.Random, n: int) -> Profile:
    return profile_of([(rng.uniform(1e-3, 9e-3), rng.uniform(1e-3, 2e-2)) for _ in range(n)],
                      [rng.choice([1, 4, 16]) * 64 * 1024 for _ in range(n)],
                      [rng.choice([0, 1, 8]) * 256 * 1024 for _ in range(n)],
                      [rng.randint(1, 8) * MB for _ in range(n)],
                      [rng.choice([0.0, rng.uniform(0, 5e-3)]) for _ in range(n)])


def every_plan(blocks: int, workers: int) -> Iterator[tuple[Stage, ...]]:
    """Every contiguous split of the blocks x every replica count per stage, all workers used."""
    for count in range(1, min(blocks, workers) + 1):
        for cuts in itertools.combinations(range(1, blocks), count - 1):
            bounds = (0, *cuts, blocks)
            for reps in itertools.combinations(range(1, workers), count - 1):
                split = (0, *reps, workers)
                yield tuple(Stage(bounds[s], bounds[s + 1], split[s + 1] - split[s])
                            for s in range(count))


def brute_force(profile: Profile, settings: SolverSettings) -> float:
    values = [e.step_s for plan in every_plan(len(profile.blocks), settings.world_size)
              if (settings.stages is None or len(plan) == settings.stages)
              and (e := estimate(profile, plan, settings)) is not None]
    return min(values, default=math.inf)


NETWORKS = {
    "one level": Network(LinkLevel.from_link("inter", "bw=1gbit,lat=50us")),
    "two levels": Network(LinkLevel.from_link("intra", "bw=20gbit,lat=5us"),
                          LinkLevel.from_link("inter", "bw=500mbit,lat=100us"), 2),
    "loopback": Network(LinkLevel("loopback", 4e-4, 5e-10, 5e-10, cores=2)),
}


@pytest.mark.parametrize("network", sorted(NETWORKS))
def test_dp_finds_the_brute_force_optimum(network: str) -> None:
    rng = random.Random(7)
    bf16 = CodecCost.of("bf16")
    for case in range(12):
        profile = random_profile(rng, rng.randint(1, 5))
        workers = rng.randint(1, 4)
        settings = SolverSettings(
            workers, NETWORKS[network], rng.choice(["1f1b", "gpipe"]), rng.randint(1, 6),
            fwd_codec=rng.choice([CodecCost.of("fp32"), bf16]),
            grad_codec=rng.choice([CodecCost.of("fp32"), bf16]), algorithm="ring",
            memory_bytes=rng.choice([None, 40 * MB, 80 * MB]),
            stages=rng.choice([None, None, 2]), keep=3, front=10_000)
        best = brute_force(profile, settings)
        if math.isinf(best):
            with pytest.raises(ConfigError, match="no plan of toy|stages for a model|stages need"):
                solve(profile, settings)
            continue
        found = solve(profile, settings)
        assert found[0].estimate.step_s == pytest.approx(best, rel=1e-12), (case, settings)
        for c in found:  # the DP's bookkeeping is the closed form of the plan it returns
            again = estimate(profile, c.stages, settings)
            assert again is not None and again.step_s == pytest.approx(c.estimate.step_s,
                                                                         rel=1e-12)
        assert [c.estimate.step_s for c in found] == sorted(c.estimate.step_s for c in found)


def test_objective_terms_by_hand() -> None:
    """Two stages, one rank each, 4 micro-batches on 1 Gbit/s with 100 us latency."""
    profile = profile_of([(0.010, 0.020), (0.005, 0.015), (0.004, 0.006)],
                         [1_000_000, 500_000, 10], [0, 0, 0])
    net = Network(LinkLevel.from_link("inter", "bw=1gbit,lat=100us"))
    settings = SolverSettings(2, net, "1f1b", 4)
    e = estimate(profile, (Stage(0, 1), Stage(1, 3)), settings)
    wire = 1_000_000 * 8 / 1e9  # 8 ms per message each way, fp32 raw
    t0, t1 = 0.030, 0.030  # compute only: raw fp32 costs no coding
    assert e is not None
    assert e.steady_s == pytest.approx(max(3 * t0, 3 * t1, 3 * wire))
    assert e.fill_drain_s == pytest.approx(t0 + t1 + 2 * (wire + 100e-6))
    assert e.allreduce_s == 0.0
    # GPipe: forward then backward messages share the link's time per micro-batch
    gpipe = estimate(profile, (Stage(0, 1), Stage(1, 3)), SolverSettings(2, net, "gpipe", 4))
    assert gpipe is not None and gpipe.steady_s == pytest.approx(max(3 * t0, 3 * 2 * wire))


def test_replicas_add_their_all_reduce_and_share_micro_batches() -> None:
    """Data parallelism on 2 ranks: each takes half the micro-batches, then a ring all-reduce
    of the parameters (2 (N-1) alpha + 2 (N-1)/N S beta + (N-1)/N S gamma for N = 2)."""
    profile = profile_of([(0.01, 0.02)], [4096], [4 * MB])
    level = LinkLevel("inter", 1e-4, 1e-9, 2e-10)
    settings = SolverSettings(2, Network(level), "gpipe", 4, algorithm="ring")
    e = estimate(profile, (Stage(0, 1, 2),), settings)
    size = 4 * MB
    ring = 2 * 1e-4 + size * 1e-9 + size / 2 * 2e-10
    assert e is not None
    assert e.steady_s == pytest.approx(1 * 0.03) and e.fill_drain_s == pytest.approx(0.03)
    assert e.allreduce_s == pytest.approx(ring)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_equal_stages_give_the_textbook_time_and_match_the_simulator(schedule: str) -> None:
    """P equal stages of f + b with free links: (M + P - 1)(f + b), as `simulate` plays it."""
    free = Network(LinkLevel("intra", 0.0, 0.0))
    for p, m in itertools.product(range(1, 5), range(1, 7)):
        # every backward after a rank's first adds 0.004 s into existing gradients
        profile = profile_of([(0.01, 0.02)] * p, [1024] * p, [0] * p, acc=[0.004] * p)
        stages = tuple(Stage(s, s + 1) for s in range(p))
        settings = SolverSettings(p, free, schedule, m)
        e = estimate(profile, stages, settings)
        assert e is not None
        assert e.step_s == pytest.approx((m + p - 1) * (0.03 + 0.004 * (m - 1) / m))
        simulated = pipeline_time(profile, settings.plan(stages), free).step_s
        assert e.step_s == pytest.approx(simulated)


def test_in_flight_agrees_with_stage_memory_on_replicated_plans() -> None:
    profile = profile_of([(0.01, 0.02)] * 4, [1024] * 4, [4096] * 4, [MB] * 4)
    free = Network(LinkLevel("intra", 0.0, 0.0))
    for schedule, m in itertools.product(["gpipe", "1f1b"], [2, 3, 4, 6, 8]):
        for plan in every_plan(4, 4):
            if max(st.replicas for st in plan) > m:
                continue
            settings = SolverSettings(sum(st.replicas for st in plan), free, schedule, m,
                                      optimizer="adam")
            memory = stage_memory(profile, PipelinePlan(plan, schedule, m), "adam")
            for s, st in enumerate(plan):
                assert in_flight(schedule, len(plan) - s, m, st.replicas) == memory[s].in_flight
                assert stage_bytes(profile, st, len(plan) - s, settings) == \
                    memory[s].total_bytes


def test_memory_limit_is_respected_and_an_impossible_one_named() -> None:
    profile = profile_of([(0.01, 0.02)] * 4, [1024] * 4, [MB] * 4, [8 * MB] * 4)
    net = NETWORKS["one level"]
    tight = SolverSettings(2, net, "1f1b", 4, memory_bytes=40 * MB)
    for c in solve(profile, tight):
        assert all(stage_bytes(profile, st, len(c.stages) - s, tight) <= 40 * MB
                   for s, st in enumerate(c.stages))
    with pytest.raises(ConfigError, match=r"fits --memory 1000 bytes per rank: block 0 \('b0'\) "
                                          r"alone needs 11534336 bytes"):
        solve(profile, SolverSettings(2, net, memory_bytes=1000))


def test_more_stages_than_blocks_or_ranks_is_one_clear_error() -> None:
    profile = profile_of([(0.01, 0.02)] * 3, [1024] * 3, [0] * 3)
    net = NETWORKS["one level"]
    with pytest.raises(ConfigError, match="5 stages for a model of 3 blocks .*use 1..3 stages"):
        solve(profile, SolverSettings(8, net, microbatches=8, stages=5))
    with pytest.raises(ConfigError, match="3 stages need at least 3 ranks, the world size is 2"):
        solve(profile, SolverSettings(2, net, stages=3))
    with pytest.raises(ConfigError, match="unknown schedule 'zb'; valid: 1f1b, gpipe"):
        SolverSettings(2, net, schedule="zb")
