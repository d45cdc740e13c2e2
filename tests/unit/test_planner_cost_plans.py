"""Step time of data-parallel, pipeline and hybrid plans, and memory per stage, by hand and
against the pipeline package's schedule simulator."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from approxdist.config.dp import DPConfig
from approxdist.data_parallel.buckets import ParamInfo, plan_buckets
from approxdist.data_parallel.module import DataParallel
from approxdist.errors import ConfigError
from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.profiler import measure_blocks
from approxdist.pipeline.schedule import Durations, build_schedule, simulate
from approxdist.planner.cost import (
    CodecCost,
    DPOptions,
    LinkLevel,
    Network,
    PipelinePlan,
    Stage,
    dp_time,
    pipeline_time,
    stage_memory,
)
from approxdist.planner.cost.dp import SOLO_MB
from approxdist.planner.profile import BlockProfile, Profile

MIB = 1 << 20
FREE = Network(LinkLevel("intra", 0.0, 0.0))


def _profile(*blocks: tuple[float, float, int, int, int], batch: int = 4) -> Profile:
    """Blocks as (fwd_s, bwd_s, out_bytes, param_bytes, stash_bytes)."""
    return Profile("toy", (16,), batch, 1, "test", "test",
                   tuple(BlockProfile(f"b{i}", *b) for i, b in enumerate(blocks)))


# -- data parallel -------------------------------------------------------------------------

DP_PROFILE = _profile((0.01, 0.02, 64, 2 * MIB, 0), (0.01, 0.03, 64, 0, 0),
                      (0.02, 0.01, 64, MIB, 0))


def _ring(beta: float) -> tuple[Network, DPOptions]:
    return Network(LinkLevel("intra", 0.0, beta)), DPOptions(algorithm="ring")


def test_dp_buckets_start_when_their_backward_is_done() -> None:
    net, opts = _ring(1e-9)
    t = dp_time(DP_PROFILE, 2, net, opts)
    # buckets as DataParallel plans them: b2 (1 MiB, alone), then b0 (2 MiB, alone); b1
    # holds no parameters. Ring on 2 ranks sends S bytes per rank: S x 1e-9 s
    assert [b.blocks for b in t.buckets] == [(2,), (0,)]
    assert [b.fp32_bytes for b in t.buckets] == [MIB, 2 * MIB]
    assert [b.ready_s for b in t.buckets] == pytest.approx([0.01, 0.06])  # bwd of b2; of all
    assert [b.end_s for b in t.buckets] == pytest.approx([0.01 + MIB * 1e-9, 0.06 + 2 * MIB * 1e-9])
    assert (t.forward_s, t.backward_s) == pytest.approx((0.04, 0.06))
    assert t.comm_s == pytest.approx(3 * MIB * 1e-9)
    assert t.exposed_comm_s == pytest.approx(2 * MIB * 1e-9)  # b2's hid behind b1's backward
    assert t.step_s == pytest.approx(0.04 + 0.06 + 2 * MIB * 1e-9)
    assert t.samples_per_step == 8 and t.samples_per_s == pytest.approx(8 / t.step_s)


def test_dp_buckets_tensor_by_tensor_where_the_profile_lists_them() -> None:
    """A block's tensors are bucketed one by one, as `DataParallel` does; the bucket is
    ready when the earliest block it holds a tensor of is done."""
    half = 3 * MIB // 8
    blocks = (BlockProfile("b0", 0.01, 0.02, 64, 3 * half, 0, param_sizes=(half,) * 3),
              BlockProfile("b1", 0.01, 0.03, 64, MIB // 8, 0, param_sizes=(MIB // 8,)))
    t = dp_time(Profile("toy", (16,), 4, 1, "test", "test", blocks), 2, *_ring(1e-9))
    # last to first, first bucket 0.25 MiB: b1 alone; then 1 MiB buckets: two of b0's
    # tensors (0.75 MiB), the third with nothing after it. As one parameter, b0 (1.125
    # MiB, >= solo) would be one bucket
    assert [b.fp32_bytes for b in t.buckets] == [MIB // 8, 2 * half, half]
    assert [b.blocks for b in t.buckets] == [(1,), (0,), (0,)]
    assert [b.ready_s for b in t.buckets] == pytest.approx([0.03, 0.05, 0.05])
    whole = dp_time(Profile("toy", (16,), 4, 1, "test", "test", tuple(
        dataclasses.replace(b, param_sizes=()) for b in blocks)), 2, *_ring(1e-9))
    assert [b.fp32_bytes for b in whole.buckets] == [MIB // 8, 3 * half]


def test_dp_buckets_are_the_engines_for_a_profiled_model() -> None:
    """On a real model's profile the cost model's buckets are the ones `DataParallel`
    plans over the model's parameters (sizes and order)."""
    model = nn.Sequential(nn.Linear(300, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 400), nn.Linear(400, 10))
    blocks = measure_blocks(model, torch.randn(2, 300), repeat=1, warmup=0)
    profile = Profile("mlp", (300,), 2, 1, "test", "test",
                      tuple(BlockProfile(**vars(b)) for b in blocks))
    opts = DPOptions(algorithm="ring")
    infos = [ParamInfo(n, p.numel(), "fp32", i) for i, (n, p) in enumerate(model.named_parameters())]
    engine = plan_buckets(infos, int(opts.bucket_mb * MIB), int(opts.first_bucket_mb * MIB),
                          int(SOLO_MB * MIB))
    t = dp_time(profile, 2, *_ring(1e-9))
    assert [b.fp32_bytes for b in t.buckets] == [4 * p.numel for p in engine]
    assert t.buckets[0].blocks == (4, 5)  # 4's bias shares the first bucket with 5
    blockwise = dp_time(dataclasses.replace(profile, blocks=tuple(
        dataclasses.replace(b, param_sizes=()) for b in profile.blocks)), 2, *_ring(1e-9))
    assert [b.fp32_bytes for b in blockwise.buckets] != [4 * p.numel for p in engine]


def test_dp_a_slow_bucket_holds_up_the_next_one() -> None:
    net, opts = _ring(5e-8)
    t = dp_time(DP_PROFILE, 2, net, opts)
    first_end = 0.01 + MIB * 5e-8  # 0.0624 s: after b0 became ready at 0.06
    assert t.buckets[1].start_s == pytest.approx(first_end)
    assert t.step_s == pytest.approx(0.04 + first_end + 2 * MIB * 5e-8)


def test_dp_without_overlap_every_bucket_waits_for_the_whole_backward() -> None:
    net, _ = _ring(1e-9)
    t = dp_time(DP_PROFILE, 2, net, DPOptions(algorithm="ring", overlap=False, optimizer_s=0.005))
    assert [b.ready_s for b in t.buckets] == pytest.approx([0.06, 0.06])
    assert t.exposed_comm_s == pytest.approx(3 * MIB * 1e-9)
    assert t.step_s == pytest.approx(0.04 + 0.06 + 3 * MIB * 1e-9 + 0.005)


def test_dp_auto_names_the_algorithm_per_bucket_and_one_rank_costs_nothing() -> None:
    net = Network(LinkLevel.from_link("inter", "bw=1gbit,lat=100us"))
    t = dp_time(DP_PROFILE, 4, net)
    assert all(b.algorithm in ("ring", "brb", "brd", "vhd", "native") for b in t.buckets)
    alone = dp_time(DP_PROFILE, 1, net)
    assert alone.comm_s == 0.0 and alone.step_s == pytest.approx(0.1)


def test_dp_defaults_are_the_engines() -> None:
    assert inspect.signature(DataParallel.__init__).parameters["solo_mb"].default == SOLO_MB
    opts, cfg = DPOptions(), DPConfig()
    assert (opts.algorithm, opts.bucket_mb, opts.first_bucket_mb, opts.overlap) == \
        (cfg.algorithm, cfg.bucket_mb, cfg.first_bucket_mb, cfg.overlap)
    with pytest.raises(ConfigError, match=r"bucket_mb = -1 must be a finite number >= 0"):
        DPOptions(bucket_mb=-1)
    with pytest.raises(ConfigError, match=r"world_size = 0 must be an integer >= 1"):
        dp_time(DP_PROFILE, 0, FREE)


# -- pipelines -----------------------------------------------------------------------------

def _equal(stages: int, f: float, b: float) -> Profile:
    return _profile(*[(f, b, 1024, 4096, 512)] * stages)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 5), m=st.integers(1, 8), f=st.sampled_from([0.5, 1.0, 2.0, 3.0]),
       b=st.sampled_from([0.5, 1.0, 2.0, 3.0]), schedule=st.sampled_from(["gpipe", "1f1b"]))
def test_equal_stages_without_comm_take_the_closed_form(p: int, m: int, f: float, b: float,
                                                        schedule: str) -> None:
    plan = PipelinePlan(tuple(Stage(s, s + 1) for s in range(p)), schedule, m)
    t = pipeline_time(_equal(p, f, b), plan, FREE)
    assert t.makespan_s == pytest.approx((m + p - 1) * (f + b))
    # one source of truth: the same as the schedule simulator with one time per kind
    assert t.makespan_s == pytest.approx(
        simulate(build_schedule(schedule, p, m), p, Durations(f, b)).makespan)
    if f == b:
        assert t.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


def test_a_two_stage_pipeline_with_coded_transfers_by_hand() -> None:
    prof = _profile((1.0, 2.0, 4_000_000, 0, 0), (0.5, 1.0, 40, 0, 0))
    bf16 = CodecCost("bf16", 1e-8, 2e-8)  # 0.04 s to encode 4 MB of fp32, 0.08 s to decode
    net = Network(LinkLevel("intra", 0.25, 1e-7))
    plan = PipelinePlan((Stage(0, 1), Stage(1, 2)), "1f1b", 1, fwd_codec=bf16, bwd_codec=bf16)
    t = pipeline_time(prof, plan, net, optimizer_s=0.1)
    wire = 1e-7 * (2 * 1_000_000 + 16)  # 10^6 bf16 values and the 16-byte header
    # 0F0, encode, link, latency, 1F0 + decode, 1B0, encode, link, latency, 0B0 + decode
    expected = 1.0 + 0.04 + wire + 0.25 + 0.58 + 1.0 + 0.04 + wire + 0.25 + 2.08
    assert t.makespan_s == pytest.approx(expected)
    assert t.step_s == pytest.approx(expected + 0.1)
    s0, s1 = t.durations.stages
    assert (s0.send_act, s0.act_wire, s0.act_latency) == pytest.approx((0.04, wire, 0.25))
    assert (s1.forward, s0.backward) == pytest.approx((0.58, 2.08))


def test_hybrid_replicas_all_reduce_after_their_last_backward_by_hand() -> None:
    # stage 0 (blocks 0-1, 2 replicas) on node 0, stage 1 on node 1; the replicas' ring costs
    # 2 messages x alpha 0.25 = 0.5 s; transfers between the nodes are free
    prof = _profile((0.5, 0.5, 64, MIB, 0), (0.5, 0.5, 64, 0, 0), (1.0, 1.0, 64, 0, 0))
    net = Network(LinkLevel("intra", 0.25, 0.0), LinkLevel("inter", 0.0, 0.0), ranks_per_node=2)
    plan = PipelinePlan((Stage(0, 2, replicas=2), Stage(2, 3)), "1f1b", 2, algorithm="ring")
    t = pipeline_time(prof, plan, net)
    assert [s.all_reduce for s in t.durations.stages] == [0.5, 0.0]
    # slot 0: 0F0 [0,1], 0B0 [3,4]; slot 1: 0F1 [0,1], 0B1 [5,6]; stage 1: F0 B0 F1 B1 in [1,5];
    # the all-reduce waits for both replicas: [6, 6.5]
    assert t.makespan_s == pytest.approx(6.5) and t.exposed_allreduce_s == pytest.approx(0.5)
    assert t.samples_per_step == 2 * 4


def test_backwards_after_a_replicas_first_pay_for_accumulating() -> None:
    """A rank's first backward of a step writes the gradients, the others add into them
    (the profile's acc_s), spread evenly: 3 of a rank's 4 micro-batches accumulate; on 2
    replicas each runs 2, one accumulates."""
    acc = [BlockProfile(f"b{i}", 1.0, 2.0, 64, MIB, 0, 0.4) for i in range(2)]
    prof = Profile("toy", (16,), 4, 1, "test", "test", tuple(acc))
    t = pipeline_time(prof, PipelinePlan((Stage(0, 1), Stage(1, 2)), "gpipe", 4), FREE)
    assert [s.backward for s in t.durations.stages] == pytest.approx([2.0 + 0.3] * 2)
    assert t.makespan_s == pytest.approx(
        simulate(build_schedule("gpipe", 2, 4), 2, Durations(1.0, 2.3)).makespan)
    dp = pipeline_time(prof, PipelinePlan((Stage(0, 2, replicas=2),), "gpipe", 4), FREE)
    assert dp.durations.stages[0].backward == pytest.approx(4.0 + 0.8 / 2)
    one = pipeline_time(prof, PipelinePlan((Stage(0, 2),), "gpipe", 1), FREE)
    assert one.durations.stages[0].backward == pytest.approx(4.0)  # nothing to add into


def test_plans_are_checked() -> None:
    prof = _equal(4, 1.0, 1.0)
    with pytest.raises(ConfigError, match=r"stage 1 = blocks \[3, 4\) must start at block 2"):
        PipelinePlan((Stage(0, 2), Stage(3, 4)))
    with pytest.raises(ConfigError, match=r"stage 0 replicas = 0 must be an integer >= 1"):
        PipelinePlan((Stage(0, 4, replicas=0),))
    with pytest.raises(ConfigError, match=r"micro-batches = 0 must be"):
        PipelinePlan((Stage(0, 4),), microbatches=0)
    with pytest.raises(ConfigError, match=r"cover blocks \[0, 3\) but profile 'toy' has blocks "
                                          r"\[0, 4\)"):
        pipeline_time(prof, PipelinePlan((Stage(0, 3),)), FREE)
    with pytest.raises(ConfigError, match=r"optimizer_s = -1.0 must be a finite number"):
        pipeline_time(prof, PipelinePlan((Stage(0, 4),)), FREE, optimizer_s=-1.0)
    with pytest.raises(ScheduleError, match=r"unknown schedule 'zb'; valid: 1f1b, gpipe"):
        pipeline_time(prof, PipelinePlan((Stage(0, 4),), "zb"), FREE)
    with pytest.raises(ScheduleError, match=r"micro-batches \(2\) must be at least the largest"):
        pipeline_time(prof, PipelinePlan((Stage(0, 2, 3), Stage(2, 4)), microbatches=2), FREE)


# -- memory --------------------------------------------------------------------------------

MEM = _profile(*[(1.0, 1.0, 64, 1000, 300)] * 4)


def test_memory_gpipe_keeps_every_micro_batch_1f1b_at_most_p_minus_s() -> None:
    stages = (Stage(0, 1), Stage(1, 2), Stage(2, 3), Stage(3, 4))
    gpipe = stage_memory(MEM, PipelinePlan(stages, "gpipe", 6))
    assert [m.in_flight for m in gpipe] == [6, 6, 6, 6]
    assert [m.activation_bytes for m in gpipe] == [1800] * 4
    one = stage_memory(MEM, PipelinePlan(stages, "1f1b", 6))
    assert [m.in_flight for m in one] == [4, 3, 2, 1]  # min(P - s, M)
    assert [m.in_flight for m in stage_memory(MEM, PipelinePlan(stages, "1f1b", 2))] == [2, 2, 2, 1]


def test_memory_parameters_gradients_and_optimizer_state() -> None:
    plan = PipelinePlan((Stage(0, 3), Stage(3, 4)), "1f1b", 2)
    s0, s1 = stage_memory(MEM, plan, optimizer="adam")
    assert (s0.param_bytes, s0.grad_bytes, s0.optimizer_bytes) == (3000, 3000, 6000)
    assert (s0.in_flight, s0.activation_bytes) == (2, 2 * 900)
    assert s0.total_bytes == 3000 + 3000 + 6000 + 1800
    assert stage_memory(MEM, plan, optimizer="momentum")[1].optimizer_bytes == 1000
    assert stage_memory(MEM, plan, optimizer="sgd")[1].optimizer_bytes == 0
    with pytest.raises(ConfigError, match=r"optimizer 'lamb' has no known state size; valid: "
                                          r"sgd, momentum, adam"):
        stage_memory(MEM, plan, optimizer="lamb")


def test_memory_of_replicated_stages_reads_the_dealt_schedule() -> None:
    # 1F1B-RR: replica 0 of stage 0 runs 0F0 0B0 0F2 0B2 (the base order filtered): 1 in flight
    plan = PipelinePlan((Stage(0, 2, replicas=2), Stage(2, 4)), "1f1b", 4)
    assert [m.in_flight for m in stage_memory(MEM, plan)] == [1, 1]
    dp = stage_memory(MEM, PipelinePlan((Stage(0, 4, replicas=4),), "gpipe", 4))
    assert dp[0].in_flight == 1 and dp[0].param_bytes == 4000
