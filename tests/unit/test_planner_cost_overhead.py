"""The engines' overhead in the cost model: its terms by hand, the no-free-core rule of data
parallelism, its fit on the tiny model's rows (recovering known values), its calibration
file entry, and bad input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from approxdist.errors import ConfigError, DataError
from approxdist.pipeline.schedule import simulate
from approxdist.planner.cost import (
    LinkLevel,
    Network,
    PipelinePlan,
    Stage,
    allreduce_time,
    dp_time,
)
from approxdist.planner.cost.calibration_file import CostCalibration, from_json
from approxdist.planner.cost.dp import DPOptions
from approxdist.planner.cost.nnls import nonnegative_lstsq
from approxdist.planner.cost.overhead import OverheadRow, RuntimeOverhead, fit_linear
from approxdist.planner.cost.pipeline import pipeline_time
from approxdist.planner.objective import SolverSettings, estimate
from approxdist.planner.profile import BlockProfile, Profile, scale_times
from approxdist.planner.validation import engine_runs

MB = 1 << 20
FREE = Network(LinkLevel("intra", 0.0, 0.0, 0.0))


def toy(times: list[tuple[float, float]], params: list[int], out: int = 64) -> Profile:
    blocks = tuple(BlockProfile(f"b{i}", f, b, out, p, out)
                   for i, ((f, b), p) in enumerate(zip(times, params)))
    return Profile("toy", (4,), 1, 1, "test", "test", blocks)


@pytest.mark.parametrize(("stages", "m"), [(2, 4), (3, 8), (4, 2)])
def test_actions_and_the_step_overhead_by_hand(stages: int, m: int) -> None:
    f, b, a, s = 1e-3, 2e-3, 3e-4, 5e-4
    profile = toy([(f, b)] * stages, [MB] * stages)
    plan = PipelinePlan(tuple(Stage(i, i + 1) for i in range(stages)), "gpipe", m)
    t = pipeline_time(profile, plan, FREE, 0.0, RuntimeOverhead(a, s, 9.0))
    # equal stages, free links: (M + P - 1) slots of forward + backward, each with its action
    assert t.step_s == pytest.approx((m + stages - 1) * (f + b + 2 * a) + s)
    settings = SolverSettings(stages, FREE, schedule="gpipe", microbatches=m,
                              overhead=RuntimeOverhead(a, s, 9.0))
    got = estimate(profile, plan.stages, settings)
    assert got is not None and got.step_s == pytest.approx((m + stages - 1) * (f + b + 2 * a))


def test_the_step_overhead_is_cpu_work_slowed_by_shared_cores() -> None:
    profile = toy([(1e-3, 2e-3)] * 4, [MB] * 4)
    plan = PipelinePlan(tuple(Stage(i, i + 1) for i in range(4)), "1f1b", 4)
    over = RuntimeOverhead(2e-4, 1e-3, 0.0)
    two = Network(LinkLevel("loopback", 0.0, 0.0, 0.0, cores=2))
    four = Network(LinkLevel("loopback", 0.0, 0.0, 0.0, cores=4))
    on_two, on_four = (pipeline_time(profile, plan, n, 0.0, over) for n in (two, four))
    # the actions (with their engine work) are played on the 2 shared cores; the step's
    # own work runs at the whole load (4 ranks on 2 cores: twice as long)
    order, _ = plan.order()
    assert on_two.makespan_s == pytest.approx(
        simulate(order, 4, on_four.durations, cores=2).makespan)
    assert on_four.step_s - on_four.makespan_s == pytest.approx(1e-3)
    assert on_two.step_s - on_two.makespan_s == pytest.approx(2e-3)


def test_data_parallel_overhead_and_no_free_core() -> None:
    # one block of 4 MB: one solo bucket, ready when the backward ends
    profile = toy([(1e-3, 4e-3)], [4 * MB])
    level = LinkLevel("loopback", 1e-4, 1e-9, 1e-9, cores=2)
    intra = LinkLevel("intra", 1e-4, 1e-9, 1e-9)
    on_loop = dp_time(profile, 2, Network(level), DPOptions(algorithm="ring",
                                                            step_overhead_s=2e-3))
    on_intra = dp_time(profile, 2, Network(intra), DPOptions(algorithm="ring",
                                                             step_overhead_s=2e-3))
    ar = on_intra.comm_s
    assert on_loop.comm_s == pytest.approx(ar)  # 2 ranks on 2 cores: load 1
    assert on_intra.step_s == pytest.approx(1e-3 + 4e-3 + ar + 2e-3)
    # the only bucket is ready at the end of backward either way: no free core changes
    # nothing here; with two buckets the second's CPU work delays the first's ready time
    assert on_loop.step_s == pytest.approx(on_intra.step_s)
    two = toy([(1e-3, 2e-3), (1e-3, 2e-3)], [4 * MB, 4 * MB])
    loop2 = dp_time(two, 2, Network(level), DPOptions(algorithm="ring"))
    intra2 = dp_time(two, 2, Network(intra), DPOptions(algorithm="ring"))
    per = intra2.comm_s / 2
    # on a free core the last block's bucket (ready after 2 ms of backward) hides under the
    # first block's backward; with none, both buckets' CPU work follows the backward
    assert intra2.step_s == pytest.approx(2e-3 + max(4e-3, 2e-3 + per) + per)
    assert loop2.step_s == pytest.approx(2e-3 + 4e-3 + 2 * per)
    # an emulated link's wait is not CPU work: it still hides under the backward
    slow = LinkLevel("loopback", 0.0, 0.0, 0.0, cores=2).with_link("bw=8gbit")
    wait = allreduce_time(slow, "ring", 2, MB)  # 4 MB: one bucket's wait on the link
    hidden = dp_time(two, 2, Network(slow), DPOptions(algorithm="ring"))
    assert hidden.step_s == pytest.approx(2e-3 + max(4e-3, 2e-3 + wait) + wait)


def test_a_second_thread_codes_one_bucket_while_another_waits_on_the_link() -> None:
    # two 4 MB buckets ready together (no overlap): CPU work w, then the link's wait l
    two = toy([(1e-3, 2e-3), (1e-3, 2e-3)], [4 * MB, 4 * MB])
    level = LinkLevel("intra", 0.0, 0.0, 0.0).with_link("bw=1gbit")
    opts = DPOptions(algorithm="ring", overlap=False, byte_overhead_s=1e-9)
    w = 4 * MB * 1e-9
    link = allreduce_time(level, "ring", 2, MB)
    one = dp_time(two, 2, Network(level), replace(opts, threads=1))
    both = dp_time(two, 2, Network(level), opts)
    assert one.step_s == pytest.approx(2e-3 + 4e-3 + 2 * (w + link))  # one stream
    # the second bucket's w runs during the first's wait; the link takes one at a time
    assert both.step_s == pytest.approx(2e-3 + 4e-3 + w + max(w, link) + link)
    with pytest.raises(ConfigError, match="threads = 0 must be an integer >= 1"):
        DPOptions(threads=0)


def test_the_fit_recovers_a_known_overhead() -> None:
    tiny = toy([(5e-5, 8e-5)] * 3, [1024] * 3)
    wide = toy([(2e-4, 4e-4)] * 3, [1024, 16 * MB, 1024])
    profiles = {engine_runs.TINY.label: tiny, engine_runs.WIDE.label: wide}
    level = LinkLevel("loopback", 2e-4, 3e-10, 8e-10, cores=2)
    net = Network(level)
    truth = RuntimeOverhead(2.5e-4, 4e-4, 9e-4, 6e-10)
    stages = (Stage(0, engine_runs.SPLIT), Stage(engine_runs.SPLIT, 3))
    measured = {}
    for key, _ in engine_runs.plans():
        if key in engine_runs.TP_MODELS:  # the tensor engine's runs: tp_overhead's fit
            continue
        if key in engine_runs.MODELS:
            profile = profiles[engine_runs.MODELS[key].label]
            measured[key] = dp_time(profile, 2, net, DPOptions(
                step_overhead_s=truth.dp_step_s, byte_overhead_s=truth.dp_byte_s)).step_s
            continue
        _, schedule, m = key.split("/")
        measured[key] = pipeline_time(tiny, PipelinePlan(stages, schedule, int(m[1:])), net,
                                      0.0, truth).step_s
    got, rms, rows = engine_runs.fit(profiles, net, measured)
    assert len(rows) == len(measured)
    for key in ("action_s", "pipeline_step_s", "dp_step_s", "dp_byte_s"):
        assert getattr(got, key) == pytest.approx(getattr(truth, key), rel=1e-6), key
    assert rms["pipeline"] == pytest.approx(0.0, abs=1e-9)
    assert rms["dp"] == pytest.approx(0.0, abs=1e-9)


def test_a_replicated_stage_pays_the_engine_per_gradient_byte() -> None:
    profile = toy([(1e-3, 2e-3)] * 2, [4 * MB, MB])
    plan = PipelinePlan((Stage(0, 1, 2), Stage(1, 2, 1)), "gpipe", 2)
    without = pipeline_time(profile, plan, FREE)
    with_bytes = pipeline_time(profile, plan, FREE, 0.0, RuntimeOverhead(dp_byte_s=1e-9))
    # stage 0's 4 MB all-reduce comes last (after the flush): the step grows by its bytes'
    # engine work; stage 1 has one replica and no all-reduce
    assert with_bytes.step_s - without.step_s == pytest.approx(4 * MB * 1e-9)
    one = toy([(1e-3, 2e-3)], [4 * MB])
    base = dp_time(one, 2, FREE, DPOptions(algorithm="ring"))
    more = dp_time(one, 2, FREE, DPOptions(algorithm="ring", byte_overhead_s=1e-9))
    assert more.step_s - base.step_s == pytest.approx(4 * MB * 1e-9)


def test_the_runs_are_the_tiny_model_on_two_ranks() -> None:
    keys = [k for k, _ in engine_runs.plans()]
    assert keys == [f"pipe/{s}/M{m}" for s in engine_runs.SCHEDULES
                    for m in engine_runs.MICROBATCHES] + ["dp", "dp-wide", "tp/D2", "tp/D8"]
    sections = dict(engine_runs.plans())
    assert sections["pipe/1f1b/M8"]["pipeline"] == {"stages": 2, "split": "2",
                                                    "microbatches": 8, "schedule": "1f1b"}
    assert sections["pipe/1f1b/M8"]["data"]["batch_size"] == 8
    assert sections["dp"]["train"]["parallel"] == "dp" and sections["dp"]["data"]["batch_size"] == 2
    assert sections["dp"]["model"] == {"name": "mlp", "hidden": 16, "depth": 2}
    assert sections["dp-wide"]["model"] == {"name": "mlp", "hidden": 2048, "depth": 2}


def test_fits_clip_at_zero_and_need_two_slopes() -> None:
    with pytest.raises(DataError, match="grow differently with the overhead"):
        fit_linear([OverheadRow("a", 1e-3, 5e-4, 4.0), OverheadRow("b", 2e-3, 5e-4, 4.0)])
    # measured times below the zero-overhead prediction: no negative overhead
    per, fixed, _ = fit_linear([OverheadRow("a", 1e-3, 2e-3, 4.0),
                                OverheadRow("b", 2e-3, 3e-3, 8.0)])
    assert per == 0.0 and fixed == 0.0
    with pytest.raises(DataError, match="measured_s = 0"):
        OverheadRow("x", 0.0, 1e-3)
    with pytest.raises(ConfigError, match="action_s = -1 must be a finite number"):
        RuntimeOverhead(action_s=-1)


def test_the_calibration_file_keeps_the_engine_overhead(tmp_path: Path) -> None:
    cal = CostCalibration.of(levels=(LinkLevel("loopback", 1e-4, 1e-9, 0.0, cores=2),),
                             overhead=RuntimeOverhead(2e-4, 3e-5, 1e-3, 5e-10))
    path = cal.save(tmp_path / "cost.json")
    assert CostCalibration.load(path).overhead == RuntimeOverhead(2e-4, 3e-5, 1e-3, 5e-10)
    data = json.loads(path.read_text())
    assert data["engine"] == {"action_s": 2e-4, "pipeline_step_s": 3e-5, "dp_step_s": 1e-3,
                              "dp_byte_s": 5e-10, "shared_action_s": 0.0, "loss_value_s": 0.0,
                              "tp_collective_s": 0.0}
    for key in ("shared_action_s", "loss_value_s", "tp_collective_s"):
        del data["engine"][key]  # files written before them: not priced
    assert from_json(data).overhead == RuntimeOverhead(2e-4, 3e-5, 1e-3, 5e-10)
    del data["engine"]
    assert from_json(data).overhead == RuntimeOverhead()  # older files: not priced
    data["engine"] = {"action_s": "fast"}
    with pytest.raises(DataError, match=r"engine: engine overhead action_s = 'fast'"):
        from_json(data, "cost.json")
    data["engine"] = {"per_message_s": 1e-4}
    with pytest.raises(DataError, match="unknown key"):
        from_json(data, "cost.json")


def test_nonnegative_least_squares_by_supports() -> None:
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert nonnegative_lstsq(a, a @ np.array([2.0, 3.0])) == pytest.approx([2.0, 3.0])
    # the unconstrained answer has a negative part: the best non-negative one drops it
    got = nonnegative_lstsq(a, np.array([2.0, -1.0, 1.0]))
    assert got is not None and got[1] == 0.0 and got[0] == pytest.approx(1.5)
    assert nonnegative_lstsq(a, np.array([-1.0, -1.0, -2.0])) is None


def test_switching_between_ranks_is_charged_only_where_they_share_cores() -> None:
    profile = toy([(1e-3, 2e-3)] * 4, [MB] * 4)
    over = RuntimeOverhead(action_s=1e-4, shared_action_s=5e-4)
    level = LinkLevel("loopback", 0.0, 0.0, 0.0, cores=2)
    two = PipelinePlan((Stage(0, 2), Stage(2, 4)), "gpipe", 4)
    four = PipelinePlan(tuple(Stage(i, i + 1) for i in range(4)), "gpipe", 4)
    # 2 ranks on 2 cores: a core each, nothing to switch
    assert pipeline_time(profile, two, Network(level), 0.0, over).step_s == pytest.approx(
        pipeline_time(profile, two, Network(level), 0.0, replace(over, shared_action_s=0.0)
                      ).step_s)
    # 4 ranks on 2 cores: every forward and backward adds it, shared like the compute
    got = pipeline_time(profile, four, Network(level), 0.0, over)
    order, _ = four.order()
    by_hand = pipeline_time(profile, four, Network(replace(level, cores=4)), 0.0,
                            RuntimeOverhead(action_s=6e-4))
    assert got.makespan_s == pytest.approx(
        simulate(order, 4, by_hand.durations, cores=2).makespan)
    assert [s.forward for s in got.durations.stages] == pytest.approx([1e-3 + 6e-4] * 4)


def test_the_shared_runs_are_a_held_out_model_above_the_cores() -> None:
    assert engine_runs.shared_worlds(2) == (3, 4) and engine_runs.shared_worlds(3) == (4,)
    assert engine_runs.shared_worlds(4) == () and engine_runs.shared_worlds(16) == ()
    assert engine_runs.shared_cuts(6, 3) == (2, 4) and engine_runs.shared_cuts(6, 4) == (2, 3, 4)
    plans = dict(engine_runs.shared_plans(3, 6))
    assert sorted(plans) == sorted(f"shared/N3/{s}/M{m}" for s in ("gpipe", "1f1b")
                                   for m in (3, 12))
    sections = plans["shared/N3/1f1b/M12"]
    assert sections["pipeline"] == {"stages": 3, "split": "2,4", "microbatches": 12,
                                    "schedule": "1f1b"}
    assert sections["train"]["world_size"] == 3 and sections["data"]["batch_size"] == 12 * 32
    from approxdist.planner.validation.configs import MODELS

    # held out: the model is none of the validation's
    assert all(spec.sections["model"] != engine_runs.SHARED.sections["model"]
               for spec in MODELS.values())


def test_the_shared_fit_recovers_a_known_switching_cost() -> None:
    profile = toy([(4e-4, 8e-4)] * 6, [MB] * 6)
    level = LinkLevel("loopback", 2e-4, 3e-10, 8e-10, cores=2)
    networks = {n: Network(level) for n in (3, 4)}
    # each world's runs priced on the profile of its own load (4 ranks: 10 % more compute)
    profiles = {3: profile, 4: scale_times(profile, 1.1)}
    truth = RuntimeOverhead(action_s=2e-4, shared_action_s=4e-4)
    measured = {}
    for n in (3, 4):
        for key, _ in engine_runs.shared_plans(n, 6):
            _, _, schedule, m = key.split("/")
            bounds = (0, *engine_runs.shared_cuts(6, n), 6)
            plan = PipelinePlan(tuple(Stage(a, b) for a, b in zip(bounds, bounds[1:])),
                                schedule, int(m[1:]))
            opt = 1e-9 * max(sum(b.param_bytes for b in profile.blocks[st.first:st.end])
                             for st in plan.stages)  # 1 ns per parameter byte
            measured[key] = pipeline_time(profiles[n], plan, networks[n], opt, truth).step_s
    measured["pipe/gpipe/M2"] = 1.0  # the 2-rank runs are not this fit's
    got, rms, rows = engine_runs.fit_shared(profiles, networks, measured, 1e-9,
                                            replace(truth, shared_action_s=0.0))
    assert got == pytest.approx(4e-4, rel=1e-6) and rms == pytest.approx(0.0, abs=1e-9)
    assert len(rows) == 8
    with pytest.raises(DataError, match="no shared run was measured"):
        engine_runs.fit_shared({3: profile}, networks, {"dp": 1.0}, 0.0, truth)
