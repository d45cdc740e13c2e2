"""`approxdist plan validate`: predicted against measured step times, ex ante first.

    approxdist plan validate --held-out --json held-out.json   # the held-out set: headline
    approxdist plan validate --quick --json validate.json
    approxdist plan validate --calibration cost.json --json validate.json   # every setting
    approxdist plan validate --calibrate-only --save-calibration cost.json  # fit, save, stop
    approxdist plan validate --tensor --calibration cost.json     # tp x dp meshes against dp

For each setting (a model on 2-4 local gloo ranks, a link and a wire format:
`planner/validation/configs.py`: by default the calibration settings, used while designing
the cost model; `--held-out` a set of models and sizes none of them uses; `--quick` the
documented subset of the calibration settings; `--tensor` the
tensor-parallel ones, whose candidates are every tp x dp mesh and data parallelism) its
N ranks first probe the model before any plan is built (`train/profile_probe.py`'s
`probe_before`: profiled alone at the thread count each rank will use, and the CPU per pass
with 1 .. N ranks computing, three times), it chooses the candidates (our best plans, data
parallelism, torchgpipe's balance-by-time split, PipeDream's optimizer's split:
`planner/validation/candidates.py`) on that profile and prices each at its load
(`planned_s`, ex ante), then times every candidate on the
ranks through the engines `train --plan` runs, interleaved (`train/plan_timing.py`),
with the same probe taken again in each round, in turn with the plans;
each plan's in-round prediction is its price on that profile (the machine the steps ran
on) at the number of ranks its compute keeps busy (`candidates.busy_ranks`, between the
two nearest measured: `candidates.at_load`), `predicted_s`.
It reports per configuration the predicted and measured step, and over all of them, first
ex ante (each plan priced on the profile it was chosen on, before the timed rounds), then
in the rounds, the
median and max absolute percentage error, Kendall's tau of predicted vs measured seconds
per sample (over every configuration, and the mean within settings), the regret of the
chosen plan (measured, against the best measured candidate of its setting) and how our
chosen plans fare against torchgpipe's and PipeDream's where they differ. Without
`--calibration` it first fits this machine's loopback level (alpha, beta, gamma) from
all-reduces of 2 and 4 ranks and messages between 2 (`bench p2p`), the optimizer's
seconds per parameter byte, and the engines' own work per pipeline action, per step and
per tp collective from a tiny model's steps on 2 ranks
(`planner/validation/engine_runs.py`, `tp_overhead.py`): no configuration is timed to fit
the model.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from approxdist.bench.host import HostWatch
from approxdist.cli.groups import command
from approxdist.cli.plan_load import ante_probe
from approxdist.cli.plan_validate_calibrate import OPTIMIZER, calibrate
from approxdist.cli.plan_validate_report import finite, print_report
from approxdist.config.loader import build_config, merge
from approxdist.errors import ConfigError
from approxdist.launch.spawn import run_on_ranks
from approxdist.planner.cluster import ClusterSpec
from approxdist.planner.cost.calibration_file import CostCalibration
from approxdist.planner.objective import SolverSettings
from approxdist.planner.plan_file import parse_plan
from approxdist.planner.profile import Profile
from approxdist.planner.search import TensorSpace, auto_microbatches, plan_dict
from approxdist.planner.tp_layout import layout_of
from approxdist.planner.validation import engine_runs
from approxdist.planner.validation.candidates import (
    Candidate,
    at_load,
    candidates,
    tensor_candidates,
)
from approxdist.planner.validation.configs import (
    CALIBRATION,
    HELD_OUT,
    MODELS,
    QUICK,
    TENSOR,
    TENSOR_MODELS,
    Setting,
    check_held_out,
    select,
)
from approxdist.train.plan_layer import plan_sections
from approxdist.train.plan_timing import StepTiming, TimedPlan, probe_plans
from approxdist.train.profile_probe import by_busy, drift

#: every model the cost model was designed on: a held-out setting may use none of them
CALIBRATION_MODELS = (*MODELS.values(), *TENSOR_MODELS.values(), engine_runs.TINY,
                      engine_runs.WIDE, engine_runs.SHARED, engine_runs.DEEP)
#: timed rounds per setting: with 5, tau over all configurations read 0.77-0.83 in six
#: runs of the same code; with 9, 0.82 in two (2026-11-27, docs/planner.md), 15 minutes
ROUNDS = 9


def register(actions: Any) -> None:
    p = command(actions, "validate", help="predicted vs measured step times of held-out plans", doc=__doc__)
    p.add_argument("--quick", action="store_true", help="the documented subset (5 settings)")
    p.add_argument("--tensor", action="store_true",
                   help="the tensor-parallel settings instead: mlp and gpt-tiny on 2 and 4 "
                        "ranks, every tp x dp mesh against data parallelism")
    p.add_argument("--held-out", action="store_true",
                   help="the held-out settings instead: models and sizes no calibration "
                        "setting uses (resnet56, alexnet at width 256, gpt-tiny at 4 "
                        "sequences, MLPs of depth 4 and 8); its ex-ante figures are the "
                        "headline")
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


def _threads(cores: int, world: int) -> int:
    return max(1, cores // world)


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

    Ex ante: before any plan is built, the setting's N ranks take `ANTE_ROUNDS` probes
    (`probe_before`: the profile alone and the load factors of 1 .. N ranks computing,
    what a user's run can measure at plan time); the plans are chosen on the median
    profile alone and `planned_s` prices each at its busy ranks on those (`at_load`;
    `planned_alone_s`: on the profile alone, as a single profile prices it).
    `predicted_s` prices the same plans on the probes taken in each timed round, in turn
    with the plans: this machine's speed drifts by 5-10 % over minutes (`drift`: the
    rounds' passes alone against the ex-ante ones, reported, never priced)."""
    n = setting.world_size
    threads = _threads(cores, n)
    cfg = build_config(setting.model.sections)
    probe, before = ante_probe(cfg, setting.model.micro_batch_size, threads, n)
    ante_profiles, ante_factors = by_busy(before)
    profile = ante_profiles[0]
    cluster = ClusterSpec(world_size=n, link=setting.link or None, calibration=cal)
    codec = cluster.codec(setting.codec)
    base = SolverSettings(n, cluster.network(), fwd_codec=codec, bwd_codec=codec,
                          grad_codec=codec, algorithm="auto", optimizer=OPTIMIZER,
                          optimizer_s_per_byte=cal.optimizer_s_per_byte(OPTIMIZER),
                          optimizer_s_per_tensor=cal.optimizer_s_per_tensor(OPTIMIZER),
                          overhead=cal.overhead)
    tensor = _tensor_space(setting, profile) if setting.tensor else None
    found = tensor_candidates(profile, base, tensor) if tensor is not None else \
        candidates(profile, base, auto_microbatches(n), cluster.pipedream_levels(), keep)
    plans = [TimedPlan(str(i), sections(setting, c, profile, threads))
             for i, c in enumerate(found)]
    times, probed = run_on_ranks(probe_plans, n, plans, timing, probe, timeout_s=900)[0]
    profiles, factors = by_busy(probed)
    moved = drift(before, probed)
    rows = []
    for i, c in enumerate(found):
        measured = sorted(times[str(i)])[len(times[str(i)]) // 2]
        predicted, busy, factor = at_load(c, profiles, factors, base, tensor)
        planned, ante_busy, ante_factor = at_load(c, ante_profiles, ante_factors, base, tensor)
        rows.append({"setting": setting.key, "model": setting.model.label, "world_size": n,
                     "link": setting.link or "none", "codec": setting.codec,
                     "mode": c.ranked.mode, "plan": c.describe(), "choosers": list(c.choosers),
                     "samples_per_step": c.ranked.samples_per_step,
                     "predicted_s": predicted, "planned_s": planned,
                     "planned_alone_s": c.ranked.step_s, "planned_parts": c.ranked.parts,
                     "measured_s": measured, "rounds_s": times[str(i)], "threads": threads,
                     "busy_ranks": busy, "load_factor": factor, "load_factors": list(factors),
                     "ante_busy_ranks": ante_busy, "ante_load_factor": ante_factor,
                     "ante_load_factors": list(ante_factors), "drift": moved,
                     "load_rounds": [[r.alone_s, *r.partial_s, r.loaded_s] for r in probed],
                     "ante_rounds": [[r.alone_s, *r.partial_s, r.loaded_s] for r in before]})
    return rows


def _tensor_space(setting: Setting, profile: Profile) -> TensorSpace:
    """The setting's model split by its own plan, over every tp size of its world."""
    cfg = build_config(setting.model.sections)
    sizes = tuple(t for t in range(2, setting.world_size + 1) if setting.world_size % t == 0)
    layout = layout_of(cfg.model, cfg.data, profile.micro_batch_size, "", sizes)
    return TensorSpace(layout, sizes)


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
    picked = [f for f in ("tensor", "quick", "held_out") if getattr(args, f)]
    if len(picked) > 1:
        raise ConfigError(f"--{picked[0].replace('_', '-')} and --{picked[1].replace('_', '-')} "
                          f"pick two sets of settings; give one (--only narrows either)")
    settings = select(TENSOR if args.tensor else QUICK if args.quick else
                      check_held_out(HELD_OUT, CALIBRATION_MODELS) if args.held_out
                      else CALIBRATION, args.only)
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
        if args.tensor and args.calibration and cal.overhead.tp_collective_s == 0:
            print(f"note: --calibration {str(args.calibration)!r} prices no tensor-engine work "
                  f"per tp collective (engine.tp_collective_s is 0 or absent, as in files "
                  f"written before it); refit with --calibrate-only --save-calibration FILE "
                  f"to price it")
        rows: list[dict[str, Any]] = []
        for i, setting in enumerate(settings):
            got = measure_setting(setting, cal, timing, args.keep, cores)
            rows += got
            factors = got[0]["load_factors"]
            fewer = "".join(f", {k} x{f:.3f}" for k, f in enumerate(factors[1:-1], 2))
            print(f"[{i + 1}/{len(settings)}] {setting.key}: {len(got)} plan(s) timed; compute "
                  f"under its load x{factors[-1]:.3f} (CPU per pass, against alone; ranks "
                  f"computing: {len(factors)} x{factors[-1]:.3f}{fewer})", flush=True)
    summary = print_report(rows, "held-out" if args.held_out else "tensor" if args.tensor
                           else "calibration")
    print(host.line())
    if args.json:
        out = {**summary, "configs": rows, "host_steal": host.steal,
               "calibration": cal.to_json(), "quick": bool(args.quick)}
        args.json.write_text(json.dumps(finite(out), indent=1, allow_nan=False) + "\n")
        print(f"wrote {args.json}")
    return 0
