"""`plan validate`'s calibration: this machine's loopback level, optimizer and engine overhead.

Fitted before any setting is timed, on all-reduces of 2 and 4 ranks, `bench p2p` messages
between 2, the optimizer's seconds per byte, and the engine-overhead models' runs
(`planner/validation/engine_runs.py`: models no setting uses; the tensor engine's per
collective by `planner/validation/tp_overhead.py`), so no configuration's step time fits
the cost model.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from approxdist.benchmarks.allreduce import BenchPlan, measure_rank, summarize
from approxdist.benchmarks.p2p import P2PPlan
from approxdist.benchmarks.p2p import measure_rank as p2p_rank
from approxdist.benchmarks.p2p import rows as p2p_rows
from approxdist.config.loader import build_config
from approxdist.launch.spawn import run_on_ranks
from approxdist.planner.cluster import ClusterSpec
from approxdist.planner.cost.calibration import fit_level
from approxdist.planner.cost.calibration_file import CostCalibration
from approxdist.planner.cost.links import Network
from approxdist.planner.cost.overhead import RuntimeOverhead
from approxdist.planner.profile import Profile
from approxdist.planner.profiler import (
    loss_s_per_value,
    optimizer_s_per_byte,
    optimizer_s_per_tensor,
    profile_run,
)
from approxdist.planner.tp_layout import layout_of
from approxdist.planner.validation import engine_runs, tp_overhead
from approxdist.train.plan_timing import StepTiming, TimedPlan, probe_plans, time_plans
from approxdist.train.profile_probe import ProfileProbe, under_load
from approxdist.train.task import task_named

#: what the loopback fit measures: sizes x algorithms on 2 and 4 ranks (fp32)
CALIBRATION_SIZES = (256 << 10, 1 << 20, 4 << 20)
CALIBRATION_ALGORITHMS = ("ring", "brd", "vhd")
#: the optimizer every plan trains with (`train`'s default: SGD with momentum)
OPTIMIZER = "momentum"
#: passes of the profile rank 0 takes in each timed round (after one warm-up pair): with
#: the default 9 rounds, 36 timed pairs in all, against the 9 of a profile taken at once
PROBE_REPEAT = 4


def calibrate(cores: int, timing: StepTiming) -> CostCalibration:
    """This machine's loopback level fitted on all-reduces of 2 and 4 ranks."""
    combos = tuple((a, "fp32") for a in CALIBRATION_ALGORITHMS)
    rows: list[dict[str, Any]] = []
    for world in (2, 4):
        plan = BenchPlan(CALIBRATION_SIZES, combos, max_repeats=20, min_repeats=5, budget_s=1.0)
        per_rank = run_on_ranks(measure_rank, world, plan, timeout_s=300)
        rows += [r.as_json() for r in summarize(per_rank, world, None)]
    ping = P2PPlan(CALIBRATION_SIZES, rounds=10)
    p2p = [r for r in p2p_rows(run_on_ranks(p2p_rank, 2, ping, timeout_s=300)[0], ping)
           if r["engine"] == "approxdist"]
    fit = fit_level("loopback", rows, p2p, cores=cores, source="approxdist plan validate")
    step = optimizer_s_per_byte(OPTIMIZER, threads=1)
    per_tensor = optimizer_s_per_tensor(OPTIMIZER, threads=1)
    loss = loss_s_per_value(task_named("classify"), threads=1)
    lv = fit.level
    print(f"calibrated loopback ({fit.rows} all-reduces of 2 and 4 ranks and messages "
          f"between 2): alpha "
          f"{lv.alpha_s * 1e6:.0f} us, beta {lv.beta_s_per_byte * 1e9:.3f} ns/B, gamma "
          f"{lv.gamma_s_per_byte * 1e9:.3f} ns/B, rms error {fit.rms_rel_error:.0%}; "
          f"{OPTIMIZER} step {step * 1e12:.0f} ps/B and {per_tensor * 1e6:.1f} us per tensor; "
          f"loss {loss * 1e9:.2f} ns per output value")
    optimizer = CostCalibration.of((fit,), optimizers={OPTIMIZER: step},
                                   optimizer_tensors={OPTIMIZER: per_tensor},
                                   overhead=RuntimeOverhead(loss_value_s=loss))
    overhead = engine_overhead(optimizer, timing, cores)
    return replace(optimizer, overhead=replace(overhead, loss_value_s=loss))


def engine_overhead(cal: CostCalibration, timing: StepTiming, cores: int) -> RuntimeOverhead:
    """The engines' CPU work per action, per step and per gradient byte, fitted on the tiny
    models' runs (`planner/validation/engine_runs.py`) timed through the engines on 2
    ranks; the tensor engine's per tp collective on their tp runs, priced with the rest
    and `cal`'s loss (`tp_overhead.fit`); and where the validation puts more ranks than
    `cores` on this machine, what an action adds there, fitted on the shared runs of a
    model no setting uses, priced on that model's profile under each world's load, as the
    settings are (`train/profile_probe.py`)."""
    profiles = {}
    for spec in (engine_runs.TINY, engine_runs.WIDE, engine_runs.SHARED, engine_runs.DEEP):
        cfg = build_config(spec.sections)
        profiles[spec.label] = profile_run(cfg.model, cfg.data, spec.micro_batch_size,
                                           threads=1)
    runs = [TimedPlan(key, sections) for key, sections in engine_runs.plans()]
    times = run_on_ranks(time_plans, engine_runs.WORLD, runs, timing, timeout_s=300)[0]
    measured = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    network = ClusterSpec(world_size=engine_runs.WORLD, calibration=cal).network()
    step, per_tensor = cal.optimizer_s_per_byte(OPTIMIZER), cal.optimizer_s_per_tensor(OPTIMIZER)
    overhead, rms, found = engine_runs.fit(profiles, network, measured, step, per_tensor)
    print(f"engine overhead ({len(found)} steps of MLPs of width 16 and 2048 on 2 ranks): "
          f"{overhead.action_s * 1e6:.0f} us per pipeline action, "
          f"{overhead.pipeline_step_s * 1e6:.0f} us per pipeline step (rms error "
          f"{rms['pipeline']:.0%}); data-parallel {overhead.dp_step_s * 1e6:.0f} us per step "
          f"and {overhead.dp_byte_s * 1e12:.0f} ps per gradient byte")
    overhead = replace(overhead, tp_collective_s=tp_collective_s(
        profiles, network, replace(overhead, loss_value_s=cal.overhead.loss_value_s), measured,
        step, per_tensor))
    worlds = engine_runs.shared_worlds(cores)
    if not worlds:
        return overhead
    blocks = len(profiles[engine_runs.SHARED.label].blocks)
    cfg = build_config(engine_runs.SHARED.sections)
    probe = ProfileProbe(cfg.model, cfg.data, engine_runs.SHARED.micro_batch_size, 1,
                         PROBE_REPEAT, cfg.pipeline.fuse_accumulation, 2 * PROBE_REPEAT)
    on_shared: dict[str, float] = {}
    loaded: dict[int, Profile] = {}
    factors: dict[int, float] = {}
    for n in worlds:
        runs = [TimedPlan(key, sections) for key, sections in engine_runs.shared_plans(n, blocks)]
        times, probed = run_on_ranks(probe_plans, n, runs, timing, probe, timeout_s=300)[0]
        on_shared.update({k: sorted(v)[len(v) // 2] for k, v in times.items()})
        loaded[n], factors[n] = under_load(probed)
    networks = {n: ClusterSpec(world_size=n, calibration=cal).network() for n in worlds}
    value, shared_rms, rows_ = engine_runs.fit_shared(loaded, networks, on_shared, step,
                                                      overhead, per_tensor)
    print(f"shared cores ({len(rows_)} steps of an MLP of width 512 on "
          f"{' and '.join(map(str, worlds))} ranks, {cores} cores; its compute under their "
          f"load x{' and x'.join(f'{factors[n]:.3f}' for n in worlds)}): "
          f"{value * 1e6:.0f} us per pipeline action (rms error {shared_rms:.0%})")
    return replace(overhead, shared_action_s=value)


def tp_collective_s(profiles: dict[str, Profile], network: Network, overhead: RuntimeOverhead,
                    measured: dict[str, float], step: float, per_tensor: float) -> float:
    """The tensor engine's seconds per tp collective, fitted on the tp runs in `measured`
    (`tp_overhead.fit`) with `overhead` and the optimizer's prices known; printed."""
    layouts = {}
    for spec in engine_runs.TP_MODELS.values():
        cfg = build_config(spec.sections)
        layouts[spec.label] = layout_of(cfg.model, cfg.data, spec.micro_batch_size, "",
                                        (engine_runs.WORLD,))
    value, rms, rows = tp_overhead.fit(profiles, layouts, network, overhead, measured, step,
                                       per_tensor)
    counts = " and ".join(f"{r.slope:.0f}" for r in sorted(rows, key=lambda r: r.slope))
    print(f"tensor engine ({len(rows)} steps of MLPs of width 16 at tp = "
          f"{engine_runs.WORLD}, {counts} collectives a step): {value * 1e6:.0f} us per tp "
          f"collective (rms error {rms:.0%})")
    return value
