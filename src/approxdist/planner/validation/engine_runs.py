"""The tiny model whose timed steps measure the engines' overhead (`cost.overhead`), held out.

`plan validate` measures the engines' own CPU work per pipeline action and per step on a
model that is in none of its settings: `TINY`, a 3-block MLP of width 16 on 16 inputs
at one sample per micro-batch, whose forward + backward (about 0.2 ms for the whole model
here) is small next to what the engines do around it. `plans` lists the runs (a 2-stage
pipeline, GPipe and 1F1B, at 2, 8 and 32 micro-batches, and data parallelism, on 2
ranks, each as the config sections `train --plan` would run); `rows` prices each with
the cost model at zero overhead and its growth per second of `action_s`, and `fit`
solves for `EngineOverhead`. Pure: the timing is the caller's (`train/plan_timing.py`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from approxdist.config.loader import merge
from approxdist.errors import DataError
from approxdist.planner.cost.dp import DPOptions, dp_time
from approxdist.planner.cost.links import Network
from approxdist.planner.cost.overhead import (
    EngineOverhead,
    OverheadRow,
    fit_dp,
    fit_pipeline,
)
from approxdist.planner.cost.pipeline import PipelinePlan, Stage, pipeline_time
from approxdist.planner.profile import Profile
from approxdist.planner.validation.configs import ModelSpec

TINY = ModelSpec("tiny-mlp", {
    "model": {"name": "mlp", "hidden": 16, "depth": 2},
    "data": {"dataset": "synthetic", "synthetic_shape": [16], "synthetic_samples": 512,
             "augment": False}}, 1)
WORLD = 2
MICROBATCHES = (2, 8, 32)
SPLIT = 2  # stage 1 starts at block 2 (of 3: two hidden layers and the classifier)
SCHEDULES = ("gpipe", "1f1b")
#: seconds of action_s at which the slope of the simulated step is first taken
PROBE_S = 1e-4
#: secant refinements: the slope is taken again between 0 and the last fit's action_s (the
#: simulated step is piecewise linear in it: the critical path may change)
REFINE = 4


def plans(threads: int = 1) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """(key, config sections) of every timed run: `pipe/<schedule>/M<m>` and `dp`."""
    base = merge(TINY.sections, {"train": {"threads": threads, "seed": 0,
                                           "world_size": WORLD}})
    out = [(f"pipe/{s}/M{m}", merge(base, {
        "train": {"parallel": "pipeline"},
        "pipeline": {"stages": WORLD, "split": str(SPLIT), "microbatches": m, "schedule": s},
        "data": {"batch_size": m * TINY.micro_batch_size}}))
        for s in SCHEDULES for m in MICROBATCHES]
    out.append(("dp", merge(base, {"train": {"parallel": "dp"},
                                   "data": {"batch_size": WORLD * TINY.micro_batch_size}})))
    return out


def _stages(profile: Profile) -> tuple[Stage, ...]:
    """The two stages `plans` runs: blocks [0, SPLIT) and [SPLIT, end)."""
    n = len(profile.blocks)
    if n <= SPLIT:
        raise DataError(f"the tiny model's profile {profile.model!r} has {n} block(s); the "
                        f"overhead runs cut it before block {SPLIT}")
    return (Stage(0, SPLIT), Stage(SPLIT, n))


def rows(profile: Profile, network: Network, measured: dict[str, float],
         optimizer_s_per_byte: float = 0.0, probe_s: float = PROBE_S) -> list[OverheadRow]:
    """Every timed run of `plans` as an `OverheadRow` (measured seconds per step, the cost
    model's at zero overhead, and its slope in `action_s` between 0 and `probe_s`)."""
    cut = _stages(profile)
    out = []
    for key, seconds in measured.items():
        if key == "dp":
            opt = optimizer_s_per_byte * sum(b.param_bytes for b in profile.blocks)
            base = dp_time(profile, WORLD, network, DPOptions(optimizer_s=opt)).step_s
            out.append(OverheadRow(key, seconds, base))
            continue
        _, schedule, m = key.split("/")
        plan = PipelinePlan(cut, schedule, int(m[1:]))
        opt = optimizer_s_per_byte * max(sum(b.param_bytes for b in profile.blocks[s.first:s.end])
                                         for s in cut)
        zero = pipeline_time(profile, plan, network, opt).step_s
        probe = pipeline_time(profile, plan, network, opt,
                              EngineOverhead(action_s=probe_s)).step_s
        out.append(OverheadRow(key, seconds, zero, (probe - zero) / probe_s))
    return out


def fit(profile: Profile, network: Network, measured: dict[str, float],
        optimizer_s_per_byte: float = 0.0) -> tuple[EngineOverhead, float, list[OverheadRow]]:
    """The engines' overhead from the timed runs, the pipeline fit's rms relative error and
    the rows of the last fit (slopes refined by secants, `REFINE` times)."""
    probe = PROBE_S
    for _ in range(1 + REFINE):
        found = rows(profile, network, measured, optimizer_s_per_byte, probe)
        action, step, rms = fit_pipeline([r for r in found if r.key != "dp"])
        if action <= 0 or abs(action - probe) <= 1e-9:
            break
        probe = action
    dp = fit_dp([r for r in found if r.key == "dp"])
    return replace(EngineOverhead(), action_s=action, pipeline_step_s=step,
                   dp_step_s=dp), rms, found
