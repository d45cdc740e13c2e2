"""The partition solver's objective: a pipeline step in closed form, bubble and transfers included.

Stage s of a plan holds blocks [first, end) on r_s replicas (placed stage-major, replicas
consecutive) and runs M micro-batches of the profile, replica m mod r_s taking
micro-batch m (PipeDream's 1F1B-RR). Per micro-batch it is busy t_s seconds: the
blocks' forward and backward and the engine's work for both (2 x `action_s`; the last
stage also the loss over the model's output, `RuntimeOverhead.loss_s`), plus the
coding of what crosses its two cuts (encoding the activation it sends and the gradient
it sends back, decoding what it receives;
`cost.pipeline.boundary`, fwd codec for activations, bwd codec for gradients). Then

    step = max( max_s (ceil(M / r_s) - 1) t_s,  max_b (ceil(M / c_b) - 1) w_b )   steady state
         + sum_s t_s + sum_b (w_act + alpha + w_grad + alpha)                      fill and drain
         + max_s AR_s                                                              weight sync

where a cut b joins c_b = lcm(r_s, r_s+1) pairs of replicas, each its own link, whose
busiest direction holds a message w_b = max(w_act, w_grad) seconds (beta x the codec's
wire bytes); AR_s is the all-reduce of stage s's parameters over its replicas (grad codec;
`cost.collectives`). With one replica per stage and free links this is the textbook
(M - 1) max_s t_s + sum_s t_s, which for P equal stages is (M + P - 1)(f + b) (Huang et al.
2019); one data-parallel stage of N replicas with M = N is t + AR. It over-counts where
the schedule overlaps the all-reduces with the drain: `pipeline_time`'s event simulation,
which re-ranks the solver's best plans, does not.

Memory per rank of stage s: parameters, gradients and optimizer state (`cost.memory`)
plus the stash of the micro-batches in flight at the schedule's peak on that replica
(`in_flight`), which for the flushed schedules depends only on the stages from s to the
last, M and r_s.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from approxdist.errors import ConfigError, unknown_name
from approxdist.pipeline.schedule import build_schedule, schedule_names
from approxdist.pipeline.schedule.action import live_change
from approxdist.pipeline.schedule.registry import PLACEMENTS
from approxdist.planner.cost.codecs import CodecCost
from approxdist.planner.cost.collectives import FP32
from approxdist.planner.cost.links import Network
from approxdist.planner.cost.memory import OPTIMIZER_STATES
from approxdist.planner.cost.overhead import NONE, RuntimeOverhead
from approxdist.planner.cost.pipeline import (
    Boundary,
    PipelinePlan,
    Stage,
    accumulate_s,
    boundary,
    replica_allreduce_s,
)
from approxdist.planner.profile import Profile


@dataclass(frozen=True)
class SolverSettings:
    """What the solver plans for: ranks and their network, the schedule and micro-batches,
    the wire formats of the three traffic classes, the memory of one rank."""

    world_size: int
    network: Network
    schedule: str = "1f1b"
    microbatches: int = 1
    fwd_codec: CodecCost = FP32
    bwd_codec: CodecCost = FP32
    grad_codec: CodecCost = FP32
    algorithm: str = "auto"
    memory_bytes: int | None = None
    optimizer: str = "momentum"
    #: seconds of the optimizer's step per parameter byte and per parameter tensor (0: not
    #: priced; `cost.optimizer_step`)
    optimizer_s_per_byte: float = 0.0
    optimizer_s_per_tensor: float = 0.0
    stages: int | None = None  # a fixed stage count; None: any
    #: the engines' own CPU work per action and per step (`cost.overhead`; zeros: unpriced)
    overhead: RuntimeOverhead = NONE
    keep: int = 5  # best plans the solver returns
    front: int = 12  # plans a cell of the solver's table keeps at most (exact below it)

    def __post_init__(self) -> None:
        for key in ("world_size", "microbatches", "keep", "front"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{key.replace('_', ' ')} = {value!r} must be an integer >= 1")
        if self.schedule not in schedule_names():
            raise ConfigError(unknown_name("schedule", self.schedule, schedule_names()))
        if self.schedule in PLACEMENTS:
            raise ConfigError(f"schedule {self.schedule!r} places several chunks per rank, "
                              f"which the planner's stages (one block range per rank) do not "
                              f"price; plan zbh1 or zbh2, or train {self.schedule} directly "
                              f"(--schedule {self.schedule})")
        if self.optimizer not in OPTIMIZER_STATES:
            raise ConfigError(unknown_name("optimizer", self.optimizer, list(OPTIMIZER_STATES)))
        for key in ("optimizer_s_per_byte", "optimizer_s_per_tensor"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not 0 <= value < float("inf"):
                raise ConfigError(f"{key} = {value!r} must be a finite number of seconds >= 0")
        if self.memory_bytes is not None and (isinstance(self.memory_bytes, bool) or
                                              not isinstance(self.memory_bytes, int) or
                                              self.memory_bytes < 1):
            raise ConfigError(f"memory = {self.memory_bytes!r} must be a whole number of bytes "
                              f">= 1 per rank, e.g. 16000000000")
        if self.stages is not None and (isinstance(self.stages, bool) or
                                        not isinstance(self.stages, int) or self.stages < 1):
            raise ConfigError(f"stages = {self.stages!r} must be an integer >= 1")

    def plan(self, stages: tuple[Stage, ...]) -> PipelinePlan:
        """These settings' `PipelinePlan` of `stages` (for the event simulation)."""
        return PipelinePlan(stages, self.schedule, self.microbatches, self.fwd_codec,
                            self.bwd_codec, self.grad_codec, self.algorithm)


@dataclass(frozen=True)
class Estimate:
    """The objective of one plan and its three parts (seconds per step)."""

    steady_s: float
    fill_drain_s: float
    allreduce_s: float

    @property
    def step_s(self) -> float:
        return self.steady_s + self.fill_drain_s + self.allreduce_s


def link_s(settings: SolverSettings, cut: Boundary) -> float:
    """Seconds a cut's link holds per micro-batch in the steady state: 1F1B sends
    activations and gradients at once, one per direction (the busier one counts); GPipe
    sends all activations, then all gradients (both count)."""
    if settings.schedule == "gpipe":
        return cut.act_wire + cut.grad_wire
    return max(cut.act_wire, cut.grad_wire)


def steady_term(settings: SolverSettings, replicas: int, stages_from_here: int, busy_s: float,
                round_trip_s: float) -> float:
    """A stage's share of the steady state: each replica runs ceil(M / r) micro-batches of
    `busy_s`, and with k of them in flight at most (`in_flight`) it waits a round trip
    (its own and every later stage's time and transfers) per k."""
    mine = math.ceil(settings.microbatches / replicas)
    k = in_flight(settings.schedule, stages_from_here, settings.microbatches, replicas)
    return max((mine - 1) * busy_s, (math.ceil(mine / k) - 1) * round_trip_s)


@functools.lru_cache(maxsize=4096)
def in_flight(schedule: str, stages_from_here: int, microbatches: int, replicas: int) -> int:
    """Peak micro-batches whose forward ran and backward did not, on the busiest replica of
    a stage with `stages_from_here` stages from it to the last (itself included)."""
    order = build_schedule(schedule, stages_from_here, microbatches)[0]
    peak = 0
    for replica in range(replicas):
        live = 0
        for a in order:
            if a.microbatch % replicas == replica:
                live += live_change(a)
                peak = max(peak, live)
    return peak


def stage_bytes(profile: Profile, stage: Stage, stages_from_here: int,
                settings: SolverSettings) -> int:
    """Bytes one rank of `stage` holds (`cost.memory.stage_memory`'s terms)."""
    blocks = profile.blocks[stage.first:stage.end]
    params = sum(b.param_bytes for b in blocks)
    stash = sum(b.stash_bytes for b in blocks)
    live = in_flight(settings.schedule, stages_from_here, settings.microbatches, stage.replicas)
    return (2 + OPTIMIZER_STATES[settings.optimizer]) * params + live * stash


def estimate(profile: Profile, stages: tuple[Stage, ...],
             settings: SolverSettings) -> Estimate | None:
    """The objective of `stages` (contiguous, covering the profile, replicas summing to the
    world size), or None where a rank's memory or the dealing cannot hold it."""
    plan = settings.plan(stages)
    plan.check_covers(profile)
    if plan.world_size != settings.world_size:
        raise ConfigError(f"the stages hold {plan.world_size} rank(s), not the world size "
                          f"{settings.world_size}")
    m, p, net = settings.microbatches, len(stages), settings.network
    if max(st.replicas for st in stages) > m:
        return None
    if settings.memory_bytes is not None and any(
            stage_bytes(profile, st, p - s, settings) > settings.memory_bytes
            for s, st in enumerate(stages)):
        return None
    busy = net.busy(settings.world_size)
    t = [sum(b.compute_s for b in profile.blocks[st.first:st.end]) + 2 * settings.overhead.action_s
         + accumulate_s(sum(b.acc_s for b in profile.blocks[st.first:st.end]), st.replicas, m)
         for st in stages]
    t[-1] += settings.overhead.loss_s(profile.blocks[-1].out_bytes)  # each micro-batch's loss
    steady = fill = 0.0
    links = []
    for s in range(p - 1):
        cut = boundary(profile, stages[s + 1].first,
                       net.level([*plan.slots(s), *plan.slots(s + 1)]), busy,
                       settings.fwd_codec, settings.bwd_codec)
        t[s] += cut.encode_act + cut.decode_grad
        t[s + 1] += cut.decode_act + cut.encode_grad
        pairs = math.lcm(stages[s].replicas, stages[s + 1].replicas)
        steady = max(steady, (math.ceil(m / pairs) - 1) * link_s(settings, cut))
        links.append(cut.act_wire + cut.act_latency + cut.grad_wire + cut.grad_latency)
        fill += links[-1]
    sync, round_trip = 0.0, fill + sum(t)
    for s, st in enumerate(stages):
        steady = max(steady, steady_term(settings, st.replicas, p - s, t[s], round_trip))
        round_trip -= t[s] + (links[s] if s < p - 1 else 0.0)
        sync = max(sync, replica_allreduce_s(profile, st, net.level(plan.slots(s)),
                                             settings.algorithm, settings.grad_codec, busy))
    return Estimate(steady, fill + sum(t), sync)
