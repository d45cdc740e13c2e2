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
for `RuntimeOverhead`. Where the validation runs more ranks than the machine has cores,
`shared_plans` adds pipelines of `SHARED` (an MLP of width 512, 2 ms of forward +
backward per micro-batch of 32 here) with one stage per rank on those world sizes,
GPipe and 1F1B at N and 4N micro-batches, for `shared_action_s`: what each action adds
when ranks share cores (fitted after the rest, on the processor-sharing simulation).
`TP_MODELS` are `TINY` and `DEEP` (the same MLP with 8 hidden layers) split over 2 ranks
by their own column-row plan, one sample a step: 1 and 7 tp all-reduces a step, for the
tensor engine's work per collective (`tp_collective_s`, fitted after the rest by
`tp_overhead`).
Pure: the timing is the caller's (`train/plan_timing.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from approxdist.config.loader import merge
from approxdist.errors import DataError
from approxdist.planner.cost.dp import DPOptions, dp_time
from approxdist.planner.cost.links import Network
from approxdist.planner.cost.optimizer_step import optimizer_step_s
from approxdist.planner.cost.overhead import (
    OverheadRow,
    RuntimeOverhead,
    fit_linear,
    refine,
)
from approxdist.planner.cost.pipeline import (
    PipelinePlan,
    Stage,
    pipeline_time,
)
from approxdist.planner.profile import Profile
from approxdist.planner.validation.configs import ModelSpec, synthetic

TINY = ModelSpec("tiny-mlp", {"model": {"name": "mlp", "hidden": 16, "depth": 2},
                             "data": synthetic(16)}, 1)
WIDE = ModelSpec("wide-mlp", merge(TINY.sections, {"model": {"hidden": 2048}}), 1)
MODELS = {"dp": TINY, "dp-wide": WIDE}
DEEP = ModelSpec("deep-mlp", merge(TINY.sections, {"model": {"depth": 8}}), 1)
#: tensor-parallel runs: tp = 2 ranks, one replica, by the model's own plan
TP_MODELS = {"tp/D2": TINY, "tp/D8": DEEP}
SHARED = ModelSpec("shared-mlp", {"model": {"name": "mlp", "hidden": 512, "depth": 5},
                                 "data": synthetic(256)}, 32)
#: the validation's largest world: the shared runs cover the sizes above the cores up to it
LARGEST = 4
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
    """(key, config sections) of every timed run: `pipe/<schedule>/M<m>`, `dp`, `dp-wide`
    and `tp/D<depth>`."""
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
    for key, spec in TP_MODELS.items():
        out.append((key, merge(base, {"train": {"parallel": "tensor"}, "tp": {"size": WORLD},
                                      "model": spec.sections["model"],
                                      "data": {"batch_size": spec.micro_batch_size}})))
    return out


def shared_worlds(cores: int) -> tuple[int, ...]:
    """World sizes of the shared runs: more ranks than `cores`, at most `LARGEST`."""
    return tuple(n for n in sorted({cores + 1, 2 * cores}) if n <= LARGEST)


def shared_cuts(blocks: int, world: int) -> tuple[int, ...]:
    """Where `world` even stages of `blocks` blocks start (after the first)."""
    return tuple(round(i * blocks / world) for i in range(1, world))


def shared_plans(world: int, blocks: int, threads: int = 1
                 ) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """(key, config sections) of the shared runs on `world` ranks: `shared/N<n>/<s>/M<m>`."""
    base = merge(SHARED.sections, {"train": {"threads": threads, "seed": 0,
                                             "world_size": world, "parallel": "pipeline"}})
    split = ",".join(map(str, shared_cuts(blocks, world)))
    return [(f"shared/N{world}/{s}/M{m}", merge(base, {
        "pipeline": {"stages": world, "split": split, "microbatches": m, "schedule": s},
        "data": {"batch_size": m * SHARED.micro_batch_size}}))
        for s in SCHEDULES for m in (world, 4 * world)]


def _stages(profile: Profile) -> tuple[Stage, ...]:
    """The two stages `plans` runs: blocks [0, SPLIT) and [SPLIT, end)."""
    n = len(profile.blocks)
    if n <= SPLIT:
        raise DataError(f"the tiny model's profile {profile.model!r} has {n} block(s); the "
                        f"overhead runs cut it before block {SPLIT}")
    return (Stage(0, SPLIT), Stage(SPLIT, n))


def rows(profiles: dict[str, Profile], network: Network, measured: dict[str, float],
         optimizer_s_per_byte: float = 0.0, probe: RuntimeOverhead | None = None,
         optimizer_s_per_tensor: float = 0.0) -> list[OverheadRow]:
    """Every timed run of `plans` as an `OverheadRow`: measured seconds per step, the cost
    model's at zero overhead, and its slope in `action_s` (pipelines) or `dp_byte_s` (data
    parallelism) between 0 and `probe`'s value. `profiles`: `TINY` and `WIDE` by label."""
    at = probe or RuntimeOverhead(action_s=PROBE_S, dp_byte_s=PROBE_S * 1e-6)
    out = []
    for key, seconds in measured.items():
        if key.startswith(("shared/", "tp/")):
            continue
        if key in MODELS:
            profile = profiles[MODELS[key].label]
            opt = optimizer_step_s(profile, (Stage(0, len(profile.blocks)),),
                                   optimizer_s_per_byte, optimizer_s_per_tensor)
            zero = dp_time(profile, WORLD, network, DPOptions(optimizer_s=opt)).step_s
            grown = dp_time(profile, WORLD, network,
                            DPOptions(optimizer_s=opt, byte_overhead_s=at.dp_byte_s)).step_s
            out.append(OverheadRow(key, seconds, zero, (grown - zero) / at.dp_byte_s))
            continue
        profile = profiles[TINY.label]
        cut = _stages(profile)
        _, schedule, m = key.split("/")
        plan = PipelinePlan(cut, schedule, int(m[1:]))
        opt = optimizer_step_s(profile, cut, optimizer_s_per_byte, optimizer_s_per_tensor)
        zero = pipeline_time(profile, plan, network, opt).step_s
        grown = pipeline_time(profile, plan, network, opt,
                              RuntimeOverhead(action_s=at.action_s)).step_s
        out.append(OverheadRow(key, seconds, zero, (grown - zero) / at.action_s))
    return out


def shared_rows(profiles: Mapping[int, Profile], networks: Mapping[int, Network],
                measured: dict[str, float], optimizer_s_per_byte: float,
                overhead: RuntimeOverhead, probe: float = PROBE_S,
                optimizer_s_per_tensor: float = 0.0) -> list[OverheadRow]:
    """Every shared run as an `OverheadRow`: measured, the cost model's prediction with
    `overhead` and no `shared_action_s`, and its growth per second of it (secant to
    `probe`). `profiles` and `networks`: `SHARED`'s profile (as its compute costs under
    that world's load: `train/profile_probe.py`) and the machine's network, by world size."""
    out = []
    for key, seconds in measured.items():
        if not key.startswith("shared/"):
            continue
        _, world, schedule, m = key.split("/")
        n = int(world[1:])
        profile = profiles[n]
        bounds = (0, *shared_cuts(len(profile.blocks), n), len(profile.blocks))
        plan = PipelinePlan(tuple(Stage(a, b) for a, b in zip(bounds, bounds[1:])), schedule,
                            int(m[1:]))
        opt = optimizer_step_s(profile, plan.stages, optimizer_s_per_byte,
                               optimizer_s_per_tensor)
        zero = pipeline_time(profile, plan, networks[n], opt,
                             replace(overhead, shared_action_s=0.0)).step_s
        grown = pipeline_time(profile, plan, networks[n], opt,
                              replace(overhead, shared_action_s=probe)).step_s
        out.append(OverheadRow(key, seconds, zero, (grown - zero) / probe))
    return out


def fit_shared(profiles: Mapping[int, Profile], networks: Mapping[int, Network],
               measured: dict[str, float], optimizer_s_per_byte: float,
               overhead: RuntimeOverhead, optimizer_s_per_tensor: float = 0.0
               ) -> tuple[float, float, list[OverheadRow]]:
    """(`shared_action_s`, rms relative error, the rows of the last round): the one
    unknown >= 0 by least squares on the relative error, its slopes refined by secants."""
    def rows_at(probe: float) -> list[OverheadRow]:
        found = shared_rows(profiles, networks, measured, optimizer_s_per_byte, overhead, probe,
                            optimizer_s_per_tensor)
        if not found:
            raise DataError("no shared run was measured: time shared_plans on the world "
                            "sizes above the cores before fitting shared_action_s")
        return found

    return refine(rows_at, PROBE_S, REFINE)


def fit(profiles: dict[str, Profile], network: Network, measured: dict[str, float],
        optimizer_s_per_byte: float = 0.0, optimizer_s_per_tensor: float = 0.0
        ) -> tuple[RuntimeOverhead, dict[str, float], list[OverheadRow]]:
    """The engines' overhead from the timed 2-rank runs, each fit's rms relative error
    (`pipeline`, `dp`) and the rows of the last round (slopes refined by secants, `REFINE`
    times); `shared_action_s` is `fit_shared`'s."""
    probe = RuntimeOverhead(action_s=PROBE_S, dp_byte_s=PROBE_S * 1e-6)
    for _ in range(1 + REFINE):
        found = rows(profiles, network, measured, optimizer_s_per_byte, probe,
                     optimizer_s_per_tensor)
        action, step, pipe_rms = fit_linear([r for r in found if r.key not in MODELS])
        per_byte, dp_step, dp_rms = fit_linear([r for r in found if r.key in MODELS])
        got = RuntimeOverhead(action, step, dp_step, per_byte)
        nxt = replace(probe, **{k: v for k, v in (("action_s", action), ("dp_byte_s", per_byte))
                                if v > 0})
        if nxt == probe:
            break
        probe = nxt
    return got, {"pipeline": pipe_rms, "dp": dp_rms}, found
