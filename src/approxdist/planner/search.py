"""Choose a plan: the solver's best candidates per schedule and micro-batch count, re-ranked by simulation.

For every schedule and micro-batch count asked for, `solver.solve` returns its best
pipeline and hybrid plans by the closed-form objective; each is then priced by the cost
model's event simulation of the schedule the ranks would run (`cost.pipeline_time`, the
pipeline package's `simulate`: one source of truth for schedules) and its memory per
stage (`cost.stage_memory`). Data parallelism (one stage on every rank, one micro-batch
per rank, as `train --parallel dp` runs it) is priced by `cost.dp_time` (buckets
overlapped with backward). Tensor parallelism on a `tp x dp` mesh (every layer the plan
splits shared by tp ranks, the rest replicated over dp; one micro-batch per replica, as
`train --parallel tensor` runs it) is priced by `cost.tp_time` for each tp size of a
`TensorSpace`. Plans are ranked by predicted seconds per sample, since plans with more
micro-batches train on larger mini-batches. `pipedream` prices the plan PipeDream's own
optimizer chooses (`pipedream_optimizer`) the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from approxdist.errors import ConfigError
from approxdist.planner.antichains import chain_states
from approxdist.planner.cost.dp import DPOptions, dp_time
from approxdist.planner.cost.memory import StageMemory, stage_memory
from approxdist.planner.cost.optimizer_step import optimizer_step_s
from approxdist.planner.cost.pipeline import (
    PipelinePlan,
    Stage,
    pipeline_time,
)
from approxdist.planner.cost.tensor import TPLayout, TPOptions, shard_profile, tp_time
from approxdist.planner.kinds import PlanKind, kind_of, used_axes
from approxdist.planner.objective import SolverSettings
from approxdist.planner.pipedream_optimizer import PipeDreamPlan, PipeDreamSettings, optimize
from approxdist.planner.profile import Profile
from approxdist.planner.solver import solve


@dataclass(frozen=True)
class RankedPlan:
    """One plan, its predicted step (simulated), memory per stage and where the time goes."""

    plan: PipelinePlan
    step_s: float
    samples_per_step: int
    memory: tuple[StageMemory, ...]
    parts: dict[str, float] = field(default_factory=dict)
    estimate_s: float | None = None  # the solver's objective (None where it did not rank it)
    tp: int = 1  # tensor-parallel shards of every replica (kind tensor)
    tp_plan: str = ""  # the layers they split, `layer.path=style,...` (kind tensor)

    @property
    def kind(self) -> PlanKind:
        """Its kind (`planner.kinds`): the axes it uses decide."""
        kind = kind_of(used_axes(self.plan, self.tp))
        assert kind is not None  # the planner prices only plans of the kinds
        return kind

    @property
    def mode(self) -> str:
        """The parallel mode that runs it (its kind's name: single, dp, pipeline, ...)."""
        return self.kind.name

    @property
    def key(self) -> tuple[object, ...]:
        """What tells two plans apart: kind, schedule (where one runs), micro-batches,
        stages and tp."""
        return (self.mode, self.plan.schedule if self.kind.scheduled else "-",
                self.plan.microbatches, self.plan.stages, self.tp)

    @property
    def per_sample_s(self) -> float:
        return self.step_s / self.samples_per_step

    @property
    def world_size(self) -> int:
        return self.plan.world_size * self.tp


@dataclass(frozen=True)
class TensorSpace:
    """The tensor-parallel plans to compare: the model's layout under its plan, the tp
    sizes, and the algorithm of the tp collectives (`tp.algorithm`)."""

    layout: TPLayout
    sizes: tuple[int, ...]
    algorithm: str = "auto"


def auto_microbatches(world_size: int) -> tuple[int, ...]:
    """What `--microbatches auto` compares: N, 2N and 4N micro-batches on N ranks (so every
    replica of a data-parallel stage gets one, two or four)."""
    return (world_size, 2 * world_size, 4 * world_size)


def search(profile: Profile, base: SolverSettings, schedules: tuple[str, ...],
           microbatches: tuple[int, ...], tensor: TensorSpace | None = None
           ) -> list[RankedPlan]:
    """Every schedule x micro-batch count's best plans, data parallelism and the tensor
    plans of `tensor` (its sizes that divide the world and the model), simulated and ranked
    by seconds per sample (fastest first); `ConfigError` if nothing fits."""
    found: list[RankedPlan] = []
    errors: list[str] = []
    if base.stages in (None, 1):
        dp = data_parallel(profile, base)
        found += [dp] if dp is not None else []
        if tensor is not None:
            refused = dict(tensor.layout.refused)
            for tp in tensor.sizes:
                if tp > 1 and base.world_size % tp == 0 and tp not in refused:
                    ranked = tensor_plan(profile, tensor, base, tp)
                    found += [ranked] if ranked is not None else []
    if base.world_size > 1 and base.stages != 1:
        for schedule in schedules:
            for m in microbatches:
                settings = replace(base, schedule=schedule, microbatches=m)
                try:
                    candidates = solve(profile, settings)
                except ConfigError as exc:
                    errors.append(str(exc))
                    continue
                found += [simulated(profile, settings, c.stages, c.estimate.step_s)
                          for c in candidates if len(c.stages) > 1]
    if not found:
        raise ConfigError(errors[0] if errors else
                          f"no plan of {profile.model} fits {base.memory_bytes} bytes per rank "
                          f"on {base.world_size} rank(s); give more memory")
    unique = {p.key: p for p in found}
    return sorted(unique.values(), key=lambda p: (p.per_sample_s, len(p.plan.stages)))


def simulated(profile: Profile, settings: SolverSettings, stages: tuple[Stage, ...],
              estimate_s: float | None = None) -> RankedPlan:
    """A pipeline or hybrid plan priced by the event simulation of its schedule."""
    plan = settings.plan(stages)
    t = pipeline_time(profile, plan, settings.network, optimizer_s(profile, settings, stages),
                      settings.overhead)
    busy = sum(b.compute_s for b in profile.blocks) * settings.microbatches
    parts = {"compute_s": busy / settings.world_size, "bubble_fraction": t.bubble_fraction,
             "exposed_allreduce_s": t.exposed_allreduce_s}
    return RankedPlan(plan, t.step_s, t.samples_per_step,
                      stage_memory(profile, plan, settings.optimizer), parts, estimate_s)


def optimizer_s(profile: Profile, settings: SolverSettings, stages: tuple[Stage, ...]) -> float:
    """The optimizer's step after the flush at `settings`' seconds per byte and per tensor
    (`cost.optimizer_step.optimizer_step_s`)."""
    return optimizer_step_s(profile, stages, settings.optimizer_s_per_byte,
                            settings.optimizer_s_per_tensor)


def replica_step_overhead_s(profile: Profile, settings: SolverSettings) -> float:
    """A replica's own work per step beyond its blocks: the data-parallel engine's
    (`dp_step_s`) and its micro-batch's loss over the model's output (`loss_s`)."""
    return settings.overhead.dp_step_s + settings.overhead.loss_s(profile.blocks[-1].out_bytes)


def data_parallel(profile: Profile, settings: SolverSettings) -> RankedPlan | None:
    """Every rank holds the whole model and one micro-batch (None if it does not fit)."""
    n = settings.world_size
    plan = PipelinePlan((Stage(0, len(profile.blocks), n),), "gpipe", n,
                        grad_codec=settings.grad_codec, algorithm=settings.algorithm)
    memory = stage_memory(profile, plan, settings.optimizer)
    if settings.memory_bytes is not None and memory[0].total_bytes > settings.memory_bytes:
        return None
    t = dp_time(profile, n, settings.network,
                DPOptions(algorithm=settings.algorithm, codec=settings.grad_codec,
                          optimizer_s=optimizer_s(profile, settings, plan.stages),
                          step_overhead_s=replica_step_overhead_s(profile, settings),
                          byte_overhead_s=settings.overhead.dp_byte_s))
    parts = {"forward_s": t.forward_s, "backward_s": t.backward_s, "allreduce_s": t.comm_s,
             "exposed_allreduce_s": t.exposed_comm_s}
    return RankedPlan(plan, t.step_s, t.samples_per_step, memory, parts)


def tensor_plan(profile: Profile, tensor: TensorSpace, settings: SolverSettings,
                tp: int) -> RankedPlan | None:
    """world / tp replicas of the model split over tp ranks each, one micro-batch per
    replica (None if a shard does not fit the memory); the plan's fwd / bwd codecs are the
    tp wires' (`--fwd-codec` means `wire.tp_fwd.codec` in this mode), its grad codec the
    replicas'."""
    replicas = settings.world_size // tp
    shard = shard_profile(profile, tensor.layout, tp)
    plan = PipelinePlan((Stage(0, len(profile.blocks), replicas),), "gpipe", replicas,
                        settings.fwd_codec, settings.bwd_codec, settings.grad_codec,
                        settings.algorithm)
    memory = stage_memory(shard, plan, settings.optimizer)
    if settings.memory_bytes is not None and memory[0].total_bytes > settings.memory_bytes:
        return None
    t = tp_time(profile, tensor.layout, replicas, settings.network,
                TPOptions(tp, settings.fwd_codec, settings.bwd_codec, tensor.algorithm,
                          engine_s=settings.overhead.tp_collective_s),
                DPOptions(algorithm=settings.algorithm, codec=settings.grad_codec,
                          optimizer_s=optimizer_s(shard, settings, plan.stages),
                          step_overhead_s=replica_step_overhead_s(profile, settings),
                          byte_overhead_s=settings.overhead.dp_byte_s if replicas > 1 else 0.0))
    parts = {"compute_s": t.compute_s, "tp_allreduce_s": sum(t.collective_s.values()),
             "tp_allreduce_count": t.collectives, "tp_sent_bytes": sum(t.wire_bytes.values()),
             "tp_engine_s": t.engine_s,
             "exposed_allreduce_s": t.dp.exposed_comm_s}
    return RankedPlan(plan, t.step_s, t.samples_per_step, memory, parts, tp=tp,
                      tp_plan=",".join(f"{k}={v}" for k, v in tensor.layout.plan))


def pipedream(profile: Profile, base: SolverSettings, settings: PipeDreamSettings,
              schedules: tuple[str, ...], microbatches: tuple[int, ...]
              ) -> tuple[PipeDreamPlan, list[RankedPlan]]:
    """PipeDream's optimizer's plan (its own objective, `pipedream_optimizer`) and that plan
    priced by our simulation for each schedule and micro-batch count (fastest first)."""
    chosen = optimize(chain_states(profile), settings)
    stages = tuple(Stage(s.first, s.end, s.replicas) for s in chosen.stages)
    priced = []
    for schedule in schedules:
        for m in microbatches:
            if m >= max(st.replicas for st in stages):
                ours = replace(base, schedule=schedule, microbatches=m)
                priced.append(simulated(profile, ours, stages) if len(stages) > 1
                              else _one_stage(profile, ours))
    if not priced:
        raise ConfigError(f"PipeDream's plan replicates a stage {max(s.replicas for s in stages)} "
                          f"times; give at least that many --microbatches")
    return chosen, sorted(priced, key=lambda p: p.per_sample_s)


def _one_stage(profile: Profile, settings: SolverSettings) -> RankedPlan:
    """PipeDream's one-stage answer: data parallelism (its memory rule already held)."""
    dp = data_parallel(profile, replace(settings, memory_bytes=None))
    assert dp is not None  # without a memory limit data parallelism always fits
    return dp


def plan_dict(profile: Profile, best: RankedPlan, link: dict[str, Any], objective: str,
              extra: dict[str, Any] | None = None,
              planned_for: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan-file contract's keys for `best` (`link`: what it was planned for, as
    `ClusterSpec.to_json` gives it; `extra`: more `predicted` keys; `planned_for`: the
    `model_options` and `data` the profile was measured with)."""
    plan = best.plan
    tp = {"tp": best.tp} if best.tp > 1 else {}
    split = {"tp_plan": best.tp_plan} if best.tp > 1 else {}
    return {
        "model": profile.model, **(planned_for or {}),
        "input_shape": list(profile.input_shape), "micro_batch_size": profile.micro_batch_size,
        "world_size": best.world_size, "mode": best.mode,
        "stages": [{"blocks": [st.first, st.end], "replicas": st.replicas, **tp}
                   for st in plan.stages], **split,
        "schedule": plan.schedule, "microbatches": plan.microbatches,
        "fwd_codec": plan.fwd_codec.spec, "bwd_codec": plan.bwd_codec.spec,
        "grad_codec": plan.grad_codec.spec, "algorithm": plan.algorithm,
        "link": link, "objective": objective,
        "predicted": {"time_per_step_s": best.step_s, "time_per_sample_s": best.per_sample_s,
                      "samples_per_step": best.samples_per_step,
                      "memory_per_stage_bytes": [m.total_bytes for m in best.memory],
                      "time": best.parts, "solver_estimate_s": best.estimate_s, **(extra or {})},
    }
