"""`approxdist plan validate`: predicted against measured step times on held-out configurations.

    approxdist plan validate --quick --json validate.json
    approxdist plan validate --calibration cost.json --json validate.json   # every setting
    approxdist plan validate --calibrate-only --save-calibration cost.json  # fit, save, stop
    approxdist plan validate --tensor --calibration cost.json     # tp x dp meshes against dp

For each setting (a model on 2-4 local gloo ranks, a link and a wire format:
`planner/validation/configs.py`; `--quick` the documented subset; `--tensor` the
tensor-parallel ones, whose candidates are every tp x dp mesh and data parallelism) it
profiles the model at the thread count each rank will use, prices the candidates (our best plans, data
parallelism, torchgpipe's balance-by-time split, PipeDream's optimizer's split:
`planner/validation/candidates.py`) on the cost model, then times every candidate on the
ranks through the engines `train --plan` runs, interleaved (`train/plan_timing.py`),
with the model profiled again in each round, in turn with the plans, alone and under the
setting's load (`train/profile_probe.py`: with every rank computing and with fewer);
each plan's prediction is its price on that profile (the machine the steps ran on) at
the number of ranks its compute keeps busy (`candidates.busy_ranks`, between the two
nearest measured), and its price on the profile it was chosen on is reported beside it
(`planned_s`).
It reports per configuration the predicted and measured step, and over all of them the
median and max absolute percentage error, Kendall's tau of predicted vs measured seconds
per sample (over every configuration, and the mean within settings), the regret of the
chosen plan (measured, against the best measured candidate of its setting) and how our
chosen plans fare against torchgpipe's and PipeDream's where they differ. Without
`--calibration` it first fits this machine's loopback level (alpha, beta, gamma) from
all-reduces of 2 and 4 ranks and messages between 2 (`bench p2p`), the optimizer's
seconds per parameter byte, and the engines' own work per pipeline action and per step
from a tiny model's steps on 2 ranks (`planner/validation/engine_runs.py`): no
configuration is timed to fit the model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from approxdist.bench.host import HostWatch
from approxdist.bench.report import Column, render
from approxdist.benchmarks.allreduce import BenchPlan, measure_rank, summarize
from approxdist.benchmarks.p2p import P2PPlan
from approxdist.benchmarks.p2p import measure_rank as p2p_rank
from approxdist.benchmarks.p2p import rows as p2p_rows
from approxdist.config.loader import build_config, merge
from approxdist.errors import ConfigError
from approxdist.launch.spawn import run_on_ranks
from approxdist.planner.cluster import ClusterSpec
from approxdist.planner.cost.calibration import fit_level
from approxdist.planner.cost.calibration_file import CostCalibration
from approxdist.planner.cost.overhead import RuntimeOverhead
from approxdist.planner.objective import SolverSettings
from approxdist.planner.plan_file import parse_plan
from approxdist.planner.profile import Profile
from approxdist.planner.profiler import optimizer_s_per_byte, profile_run
from approxdist.planner.search import TensorSpace, auto_microbatches, plan_dict
from approxdist.planner.tp_layout import layout_of
from approxdist.planner.validation import engine_runs, report
from approxdist.planner.validation.candidates import (
    Candidate,
    busy_ranks,
    candidates,
    repriced,
    tensor_candidates,
)
from approxdist.planner.validation.configs import FULL, QUICK, TENSOR, Setting, select
from approxdist.train.plan_layer import plan_sections
from approxdist.train.plan_timing import StepTiming, TimedPlan, probe_plans, time_plans
from approxdist.train.profile_probe import ProfileProbe, by_busy, under_load

#: what the loopback fit measures: sizes x algorithms on 2 and 4 ranks (fp32)
CALIBRATION_SIZES = (256 << 10, 1 << 20, 4 << 20)
CALIBRATION_ALGORITHMS = ("ring", "brd", "vhd")
#: the optimizer every plan trains with (`train`'s default: SGD with momentum)
OPTIMIZER = "momentum"
#: passes of the profile rank 0 takes in each timed round (after one warm-up pair): with
#: the default 9 rounds, 36 timed pairs in all, against the 9 of a profile taken at once
PROBE_REPEAT = 4
#: timed rounds per setting: with 5, tau over all configurations read 0.77-0.83 in six
#: runs of the same code; with 9, 0.82 in two (2026-11-27, docs/planner.md), 15 minutes
ROUNDS = 9


def register(actions: Any) -> None:
    p = actions.add_parser("validate", help="predicted vs measured step times of held-out plans",
                           description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="the documented subset (5 settings)")
    p.add_argument("--tensor", action="store_true",
                   help="the tensor-parallel settings instead: mlp and gpt-tiny on 2 and 4 "
                        "ranks, every tp x dp mesh against data parallelism")
    p.add_argument("--only", help="settings whose key contains these comma-separated parts, "
                                  "e.g. mlp-wide,N2")
    p.add_argument("--calibration", type=Path,
                   help="a cost calibration file with this machine's loopback level (default: "
                        "fit one now from all-reduces)")
    p.add_argument("--save-calibration", type=Path, metavar="FILE",
                   help="write the calibration fitted here (loopback level, optimizer, engine "
                        "overhead) to FILE, for `approxdist plan --calibration FILE`")
    p.add_argument("--calibrate-only", action="store_true",
                   help="stop after fitting and saving the calibration (needs "
                        "--save-calibration)")
    p.add_argument("--keep", type=int, default=3, help="our best plans measured per setting")
    p.add_argument("--rounds", type=int, default=ROUNDS,
                   help=f"interleaved rounds, each with a probe of the profile (default {ROUNDS})")
    p.add_argument("--steps", type=int, default=3, help="steps per plan per round (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="steps per plan before timing")
    p.add_argument("--json", type=Path, help="write the rows and the figures here")
    p.set_defaults(func=run)


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
    lv = fit.level
    print(f"calibrated loopback ({fit.rows} all-reduces of 2 and 4 ranks and messages "
          f"between 2): alpha "
          f"{lv.alpha_s * 1e6:.0f} us, beta {lv.beta_s_per_byte * 1e9:.3f} ns/B, gamma "
          f"{lv.gamma_s_per_byte * 1e9:.3f} ns/B, rms error {fit.rms_rel_error:.0%}; "
          f"{OPTIMIZER} step {step * 1e12:.0f} ps/B")
    overhead = engine_overhead(CostCalibration.of((fit,), optimizers={OPTIMIZER: step}), timing,
                               cores)
    return CostCalibration.of((fit,), optimizers={OPTIMIZER: step}, overhead=overhead)


def engine_overhead(cal: CostCalibration, timing: StepTiming, cores: int) -> RuntimeOverhead:
    """The engines' CPU work per action, per step and per gradient byte, fitted on the tiny
    models' runs (`planner/validation/engine_runs.py`) timed through the engines on 2
    ranks; and where the validation puts more ranks than `cores` on this machine, what an
    action adds there, fitted on the shared runs of a model no setting uses, priced on
    that model's profile under each world's load, as the settings are
    (`train/profile_probe.py`)."""
    profiles = {}
    for spec in (engine_runs.TINY, engine_runs.WIDE, engine_runs.SHARED):
        cfg = build_config(spec.sections)
        profiles[spec.label] = profile_run(cfg.model, cfg.data, spec.micro_batch_size,
                                           threads=1)
    runs = [TimedPlan(key, sections) for key, sections in engine_runs.plans()]
    times = run_on_ranks(time_plans, engine_runs.WORLD, runs, timing, timeout_s=300)[0]
    measured = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    network = ClusterSpec(world_size=engine_runs.WORLD, calibration=cal).network()
    step = cal.optimizer_s_per_byte(OPTIMIZER)
    overhead, rms, found = engine_runs.fit(profiles, network, measured, step)
    print(f"engine overhead ({len(found)} steps of MLPs of width 16 and 2048 on 2 ranks): "
          f"{overhead.action_s * 1e6:.0f} us per pipeline action, "
          f"{overhead.pipeline_step_s * 1e6:.0f} us per pipeline step (rms error "
          f"{rms['pipeline']:.0%}); data-parallel {overhead.dp_step_s * 1e6:.0f} us per step "
          f"and {overhead.dp_byte_s * 1e12:.0f} ps per gradient byte")
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
                                                      overhead)
    print(f"shared cores ({len(rows_)} steps of an MLP of width 512 on "
          f"{' and '.join(map(str, worlds))} ranks, {cores} cores; its compute under their "
          f"load x{' and x'.join(f'{factors[n]:.3f}' for n in worlds)}): "
          f"{value * 1e6:.0f} us per pipeline action (rms error {shared_rms:.0%})")
    return replace(overhead, shared_action_s=value)


def _threads(cores: int, world: int) -> int:
    return max(1, cores // world)


def _profile(setting: Setting, threads: int) -> Profile:
    """The setting's model profiled now, just before its plans are timed: this machine's
    speed drifts by 5-10 % over minutes (two profiles of one model minutes apart, 2-3 %
    within one), so a profile taken for the first setting of a model would not be the
    machine the later ones run on."""
    cfg = build_config(setting.model.sections)
    return profile_run(cfg.model, cfg.data, setting.model.micro_batch_size, threads,
                       fuse_accumulation=cfg.pipeline.fuse_accumulation)


def sections(setting: Setting, c: Candidate, profile: Profile, threads: int
             ) -> dict[str, dict[str, Any]]:
    """The config sections that run candidate `c` as `train --plan` would."""
    layer = plan_sections(parse_plan(plan_dict(profile, c.ranked, {"link": setting.link},
                                               "validate")))
    base = merge(setting.model.sections, {"train": {"threads": threads, "seed": 0},
                                          "comm": {"link": setting.link}})
    return merge(base, layer)


def measure_setting(setting: Setting, cal: CostCalibration, timing: StepTiming, keep: int,
                    cores: int) -> list[dict[str, Any]]:
    """Profile, predict and time every candidate of `setting`: one row per configuration.

    The plans are chosen on a profile taken just before (`planned_s`: their price on it);
    `predicted_s` prices the same plans on the profile taken in each timed round, in turn
    with the plans, alone and under the setting's load (`train/profile_probe.py`: each
    round's profile times its load factor, the median per block): this machine's speed
    drifts by 5-10 % over minutes and a single process's passes read 52 or 62 ms from
    one minute to the next (resnet20), so a profile taken apart from the steps prices
    another machine."""
    n = setting.world_size
    threads = _threads(cores, n)
    profile = _profile(setting, threads)
    cluster = ClusterSpec(world_size=n, link=setting.link or None, calibration=cal)
    codec = cluster.codec(setting.codec)
    base = SolverSettings(n, cluster.network(), fwd_codec=codec, bwd_codec=codec,
                          grad_codec=codec, algorithm="auto", optimizer=OPTIMIZER,
                          optimizer_s_per_byte=cal.optimizer_s_per_byte(OPTIMIZER),
                          overhead=cal.overhead)
    tensor = _tensor_space(setting, profile) if setting.tensor else None
    found = tensor_candidates(profile, base, tensor) if tensor is not None else \
        candidates(profile, base, auto_microbatches(n), cluster.pipedream_levels(), keep)
    plans = [TimedPlan(str(i), sections(setting, c, profile, threads))
             for i, c in enumerate(found)]
    cfg = build_config(setting.model.sections)
    probe = ProfileProbe(cfg.model, cfg.data, setting.model.micro_batch_size, threads,
                         PROBE_REPEAT, cfg.pipeline.fuse_accumulation, 2 * PROBE_REPEAT)
    times, probed = run_on_ranks(probe_plans, n, plans, timing, probe, timeout_s=900)[0]
    profiles, factors = by_busy(probed)
    rows = []
    for i, c in enumerate(found):
        measured = sorted(times[str(i)])[len(times[str(i)]) // 2]
        busy = busy_ranks(c.ranked.plan, profiles[0]) * c.ranked.tp  # every shard computes
        weights = [(k, w) for k, w in between(busy, len(profiles)) if w > 0]
        predicted = sum(w * repriced(c, profiles[k - 1], base, tensor).ranked.step_s
                        for k, w in weights)
        rows.append({"setting": setting.key, "model": setting.model.label, "world_size": n,
                     "link": setting.link or "none", "codec": setting.codec,
                     "mode": c.ranked.mode, "plan": c.describe(), "choosers": list(c.choosers),
                     "samples_per_step": c.ranked.samples_per_step,
                     "predicted_s": predicted, "planned_s": c.ranked.step_s,
                     "measured_s": measured, "rounds_s": times[str(i)], "threads": threads,
                     "busy_ranks": busy,
                     "load_factor": sum(w * factors[k - 1] for k, w in weights),
                     "load_factors": list(factors),
                     "load_rounds": [[r.alone_s, *r.partial_s, r.loaded_s] for r in probed]})
    return rows


def _tensor_space(setting: Setting, profile: Profile) -> TensorSpace:
    """The setting's model split by its own plan, over every tp size of its world."""
    cfg = build_config(setting.model.sections)
    sizes = tuple(t for t in range(2, setting.world_size + 1) if setting.world_size % t == 0)
    layout = layout_of(cfg.model, cfg.data, profile.micro_batch_size, "", sizes)
    return TensorSpace(layout, sizes)


def between(busy: float, count: int) -> tuple[tuple[int, float], tuple[int, float]]:
    """The whole numbers of busy ranks around `busy` (1 .. `count`) and their weights
    (linear)."""
    at = min(max(busy, 1.0), float(count))
    lo = min(int(at), count - 1) if count > 1 else 1
    hi = min(lo + 1, count)
    w_hi = at - lo if hi != lo else 0.0
    return (lo, 1.0 - w_hi), (hi, w_hi)


COLUMNS = (Column("setting", 28, "setting", left=True), Column("plan", 34, "plan", left=True),
           Column("chosen by", 22, show=lambda r: ",".join(r["choosers"]), left=True),
           Column("pred ms", 9, show=lambda r: f"{r['predicted_s'] * 1e3:.1f}"),
           Column("meas ms", 9, show=lambda r: f"{r['measured_s'] * 1e3:.1f}"),
           Column("err", 6, show=lambda r: f"{100 * (r['predicted_s'] / r['measured_s'] - 1):+.0f}%"))


def _rivals(summary: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for who in ("torchgpipe", "pipedream"):
        if not any(who in r["choosers"] for r in rows):
            continue  # not a candidate here (the tensor-parallel settings)
        v = summary[f"vs_{who}"]
        if not v["differ"]:
            out.append(f"vs {who}: chose the same plan as ours in every setting")
            continue
        out.append(f"vs {who}: differs in {v['differ']} setting(s); ours measured faster in "
                   f"{v['ours_faster']}, median {v['median_speedup']:.2f}x its time per sample")
    return out


def run(args: argparse.Namespace) -> int:
    if args.keep < 1:
        raise ConfigError(f"--keep {args.keep} must be >= 1 (our chosen plan is always measured)")
    if args.calibrate_only and not args.save_calibration:
        raise ConfigError("--calibrate-only fits a calibration to save: give --save-calibration "
                          "FILE too")
    if args.save_calibration and args.calibration:
        raise ConfigError(f"--save-calibration with --calibration {str(args.calibration)!r}: "
                          f"nothing is fitted when a calibration is given; drop one")
    timing = StepTiming(args.rounds, args.steps, args.warmup)
    if args.tensor and args.quick:
        raise ConfigError("--tensor and --quick pick two sets of settings; give one (--only "
                          "narrows either)")
    settings = select(TENSOR if args.tensor else QUICK if args.quick else FULL, args.only)
    cores = os.cpu_count() or 1
    with HostWatch() as host:
        cal = CostCalibration.load(args.calibration) if args.calibration \
            else calibrate(cores, timing)
        if args.save_calibration:
            print(f"wrote {cal.save(args.save_calibration)}")
            if args.calibrate_only:
                print(host.line())
                return 0
        if "loopback" not in cal.levels:
            raise ConfigError(f"--calibration {str(args.calibration)!r} has no 'loopback' level "
                              f"(it has {', '.join(sorted(cal.levels)) or 'none'}); fit one on "
                              f"this machine, or drop --calibration to fit it now")
        rows: list[dict[str, Any]] = []
        for i, setting in enumerate(settings):
            got = measure_setting(setting, cal, timing, args.keep, cores)
            rows += got
            factors = got[0]["load_factors"]
            fewer = "".join(f", {k} x{f:.3f}" for k, f in enumerate(factors[1:-1], 2))
            print(f"[{i + 1}/{len(settings)}] {setting.key}: {len(got)} plan(s) timed; compute "
                  f"under its load x{factors[-1]:.3f} (CPU per pass, against alone; ranks "
                  f"computing: {len(factors)} x{factors[-1]:.3f}{fewer})", flush=True)
    print(render(COLUMNS, rows))
    summary = report.summarize(rows)
    print(f"{summary['configs_measured']} configurations in {summary['settings']} settings; "
          f"Kendall's tau within settings {summary['kendall_tau_within']:.2f}, worst regret "
          f"{100 * summary['max_regret']:.1f} %")
    for key, text, met in report.verdicts(summary):
        print(f"  {key:12s} {text}: {'met' if met else 'NOT met'}")
    if "planned" in summary:
        p = summary["planned"]
        print(f"  priced on the profile the plans were chosen on (before the runs): median_ape "
              f"{100 * p['median_ape']:.1f} %, max_ape {100 * p['max_ape']:.1f} %, kendall_tau "
              f"{p['kendall_tau']:.2f}")
    for line in _rivals(summary, rows):
        print(f"  {line}")
    print(host.line())
    if args.json:
        out = {**summary, "configs": rows, "host_steal": host.steal,
               "calibration": cal.to_json(), "quick": bool(args.quick)}
        args.json.write_text(json.dumps(_finite(out), indent=1, allow_nan=False) + "\n")
        print(f"wrote {args.json}")
    return 0


def _finite(value: Any) -> Any:
    """`value` with every NaN (a figure with too few configurations) as null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
