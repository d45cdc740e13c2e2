"""The tiny models whose timed steps measure the engines' overhead (`cost.overhead`), held out.

`plan validate` measures the engines' own CPU work on models that are in none of its
settings: `TINY`, a 3-block MLP of width 16 on 16 inputs at one sample per
micro-batch, whose forward + backward (about 0.2 ms for the whole model here) is small
next to what the engines do around it, and `WIDE`, the same with width 2048 (17 MB of
gradients for little compute), for the data-parallel engine's work per gradient byte.
`plans` lists the runs on 2 ranks (a 2-stage pipeline of `TINY`, GPipe and 1F1B, at 2, 8
and 32 micro-batches; data parallelism of `TINY` and of `WIDE`), each as the config
sections `train --plan` would run; `fit` prices each with the cost model at zero
overhead and its growth per second of the overhead (secant slopes, refined), and solves
for `EngineOverhead`. Pure: the timing is the caller's (`train/plan_timing.py`).
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
    fit_linear,
)
from approxdist.planner.cost.pipeline import PipelinePlan, Stage, pipeline_time
from approxdist.planner.profile import Profile
from approxdist.planner.validation.configs import ModelSpec

TINY = ModelSpec("tiny-mlp", {
    "model": {"name": "mlp", "hidden": 16, "depth": 2},
    "data": {"dataset": "synthetic", "synthetic_shape": [16], "synthetic_samples": 512,
             "augment": False}}, 1)
WIDE = ModelSpec("wide-mlp", merge(TINY.sections, {"model": {"hidden": 2048}}), 1)
MODELS = {"dp": TINY, "dp-wide": WIDE}
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
    for key, spec in MODELS.items():
        out.append((key, merge(base, {"train": {"parallel": "dp"},
                                      "model": spec.sections["model"],
                                      "data": {"batch_size": WORLD * spec.micro_batch_size}})))
    return out


def _stages(profile: Profile) -> tuple[Stage, ...]:
    """The two stages `plans` runs: blocks [0, SPLIT) and [SPLIT, end)."""
    n = len(profile.blocks)
    if n <= SPLIT:
        raise DataError(f"the tiny model's profile {profile.model!r} has {n} block(s); the "
                        f"overhead runs cut it before block {SPLIT}")
    return (Stage(0, SPLIT), Stage(SPLIT, n))


def rows(profiles: dict[str, Profile], network: Network, measured: dict[str, float],
         optimizer_s_per_byte: float = 0.0, probe: EngineOverhead | None = None
         ) -> list[OverheadRow]:
    """Every timed run of `plans` as an `OverheadRow`: measured seconds per step, the cost
    model's at zero overhead, and its slope in `action_s` (pipelines) or `dp_byte_s` (data
    parallelism) between 0 and `probe`'s value. `profiles`: `TINY` and `WIDE` by label."""
    at = probe or EngineOverhead(action_s=PROBE_S, dp_byte_s=PROBE_S * 1e-6)
    out = []
    for key, seconds in measured.items():
        if key in MODELS:
            profile = profiles[MODELS[key].label]
            opt = optimizer_s_per_byte * sum(b.param_bytes for b in profile.blocks)
            zero = dp_time(profile, WORLD, network, DPOptions(optimizer_s=opt)).step_s
            grown = dp_time(profile, WORLD, network,
                            DPOptions(optimizer_s=opt, byte_overhead_s=at.dp_byte_s)).step_s
            out.append(OverheadRow(key, seconds, zero, (grown - zero) / at.dp_byte_s))
            continue
        profile = profiles[TINY.label]
        cut = _stages(profile)
        _, schedule, m = key.split("/")
        plan = PipelinePlan(cut, schedule, int(m[1:]))
        opt = optimizer_s_per_byte * max(sum(b.param_bytes for b in profile.blocks[s.first:s.end])
                                         for s in cut)
        zero = pipeline_time(profile, plan, network, opt).step_s
        grown = pipeline_time(profile, plan, network, opt,
                              EngineOverhead(action_s=at.action_s)).step_s
        out.append(OverheadRow(key, seconds, zero, (grown - zero) / at.action_s))
    return out


def fit(profiles: dict[str, Profile], network: Network, measured: dict[str, float],
        optimizer_s_per_byte: float = 0.0
        ) -> tuple[EngineOverhead, dict[str, float], list[OverheadRow]]:
    """The engines' overhead from the timed runs, each fit's rms relative error (`pipeline`,
    `dp`) and the rows of the last round (slopes refined by secants, `REFINE` times)."""
    probe = EngineOverhead(action_s=PROBE_S, dp_byte_s=PROBE_S * 1e-6)
    for _ in range(1 + REFINE):
        found = rows(profiles, network, measured, optimizer_s_per_byte, probe)
        action, step, pipe_rms = fit_linear([r for r in found if r.key not in MODELS])
        per_byte, dp_step, dp_rms = fit_linear([r for r in found if r.key in MODELS])
        got = EngineOverhead(action, step, dp_step, per_byte)
        nxt = replace(probe, **{k: v for k, v in (("action_s", action), ("dp_byte_s", per_byte))
                                if v > 0})
        if nxt == probe:
            break
        probe = nxt
    return got, {"pipeline": pipe_rms, "dp": dp_rms}, found
