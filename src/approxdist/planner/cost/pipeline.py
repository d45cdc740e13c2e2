"""Step time of GPipe, 1F1B and hybrid plans: the pipeline package's `simulate` with priced actions.

The schedule is the one the executor runs (`build_schedule`, or for replicated stages
`replicated_schedule` dealt round robin, PipeDream's 1F1B-RR with flush, routed by
`slot_route`); `simulate` plays it with `StageDurations` (one source of truth for what
a schedule does). Per stage s of blocks [first, end), per micro-batch of the profile:

- forward  = sum of fwd_s + decoding the activation received (s > 0);
- backward = sum of bwd_s + decoding the gradient received (s < P-1) + accumulating: a
  replica runs ceil(M / r) micro-batches and every backward after its first adds into
  the gradients the first wrote (the profile's `acc_s`, measured as the stage adds),
  spread evenly over its backwards (`accumulate_s`);
- a split backward (zbh1, zbh2): the first stage's `I` only decodes the gradient received
  (its inputs are data: the executor runs the whole backward in `W`); a later stage's `I`
  is the sum of the profile's `input_s` + decoding, its `W` the sum of `weight_s` +
  accumulating, each one engine action; where the profile did not measure the halves,
  `StageTimes.input_share` splits the backward (half each, the paper's T_B = T_W);
- a send keeps the rank busy while it encodes (fwd codec for activations, bwd codec for
  gradients), then occupies the boundary's link for beta x wire bytes and arrives alpha
  later (Hockney's model on the level joining the two stages' ranks); the activation is
  the stage's last block's `out_bytes` of fp32, its gradient as large;
- a replicated stage (r > 1) ends with `AR`: the all-reduce of its parameters over its
  r replicas (grad codec, `collectives.allreduce_time`), which starts when every replica
  has finished its last backward (PipeDream's weight sync after the flush).

Every coding and link term is multiplied by the level's load (loopback: busy ranks /
cores). The engines' own work (`overhead.RuntimeOverhead`, measured on a tiny model) adds
`action_s` to every forward and every backward of a micro-batch, the loss's
`loss_value_s` x the model's output values to every forward of the last stage,
`pipeline_step_s` once per step and `dp_byte_s` per gradient byte to a replicated stage's all-reduce, all CPU
work like the compute. Compute is the profile's, except where more ranks than cores
share a loopback machine (`Network.shared_cores`): there the schedule is simulated on
those cores, the forwards and backwards running at each moment sharing them equally
(`simulate(..., cores=)`, processor sharing: a rank waiting for a message holds no
core) and each forward and backward adds the engine's `shared_action_s` (the switching
between ranks, measured on held-out pipelines of 3 and 4 ranks), while coding, link
terms, all-reduces and the step's own work keep the level's load (busy ranks / cores)
for the whole step. The step is the makespan plus the optimizer's seconds and the step
overhead; the bubble is the timeline's idle share. With P equal stages of f and b seconds
and no communication this is (M + P - 1)(f + b) for both schedules (Huang et al. 2019;
Narayanan et al. 2021). The exposed all-reduce is the
makespan minus that of the same plan with free all-reduces (what the flush does not hide:
all of it, in these schedules).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from approxdist.errors import ConfigError
from approxdist.pipeline.schedule import (
    Order,
    StageDurations,
    StageTimes,
    Timeline,
    build_schedule,
    simulate,
)
from approxdist.pipeline.schedule.replicated import check_dealing, replicated_schedule, slot_route
from approxdist.pipeline.schedule.simulate import Route, stage_route
from approxdist.planner.cost.codecs import CodecCost
from approxdist.planner.cost.collectives import FP32, allreduce_time
from approxdist.planner.cost.links import LinkLevel, Network
from approxdist.planner.cost.overhead import NONE, RuntimeOverhead
from approxdist.planner.cost.split import split_backward_s
from approxdist.planner.profile import Profile
from approxdist.topology.dealing import Dealing


@dataclass(frozen=True)
class Stage:
    """Blocks [first, end) of the profile on `replicas` ranks."""

    first: int
    end: int
    replicas: int = 1


@dataclass(frozen=True)
class PipelinePlan:
    """Stages (contiguous, covering every block), schedule, micro-batches, wire formats."""

    stages: tuple[Stage, ...]
    schedule: str = "1f1b"
    microbatches: int = 1
    fwd_codec: CodecCost = FP32
    bwd_codec: CodecCost = FP32
    grad_codec: CodecCost = FP32
    algorithm: str = "auto"  # the replicas' all-reduce

    def __post_init__(self) -> None:
        if not self.stages:
            raise ConfigError("a pipeline plan needs at least one stage, e.g. (Stage(0, 4),)")
        at = self.stages[0].first
        for s, st in enumerate(self.stages):
            if st.first != at or st.end <= st.first:
                raise ConfigError(f"stage {s} = blocks [{st.first}, {st.end}) must start at "
                                  f"block {at} (where stage {s - 1} ends) and hold >= 1 block")
            if isinstance(st.replicas, bool) or not isinstance(st.replicas, int) \
                    or st.replicas < 1:
                raise ConfigError(f"stage {s} replicas = {st.replicas!r} must be an integer >= 1")
            at = st.end
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int) \
                or self.microbatches < 1:
            raise ConfigError(f"micro-batches = {self.microbatches!r} must be an integer >= 1")

    @property
    def world_size(self) -> int:
        return sum(st.replicas for st in self.stages)

    def slots(self, stage: int) -> range:
        """Stage-major positions (ranks, placed consecutively) of the stage's replicas."""
        first = sum(st.replicas for st in self.stages[:stage])
        return range(first, first + self.stages[stage].replicas)

    def check_covers(self, profile: Profile) -> None:
        n = len(profile.blocks)
        if self.stages[0].first != 0 or self.stages[-1].end != n:
            raise ConfigError(f"the stages cover blocks [{self.stages[0].first}, "
                              f"{self.stages[-1].end}) but profile {profile.model!r} has "
                              f"blocks [0, {n}); the stages must cover all of them")

    def order(self) -> tuple[Order, Route]:
        """The schedule every rank runs and how its messages route."""
        p, m = len(self.stages), self.microbatches
        if all(st.replicas == 1 for st in self.stages):
            return build_schedule(self.schedule, p, m), stage_route
        dealing = Dealing(tuple(st.replicas for st in self.stages))
        check_dealing(dealing, m)
        return replicated_schedule(self.schedule, dealing, m), slot_route(dealing)


@dataclass(frozen=True)
class PipelineTime:
    """Predicted seconds of one step of a pipeline or hybrid plan."""

    step_s: float
    makespan_s: float
    bubble_fraction: float
    exposed_allreduce_s: float
    optimizer_s: float
    samples_per_step: int
    durations: StageDurations
    timeline: Timeline

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_step / self.step_s if self.step_s > 0 else math.inf


@dataclass(frozen=True)
class Boundary:
    """Per micro-batch costs of the cut after block `cut - 1`: the activation going down
    (encoded by the sender, on the link, decoded by the receiver) and its gradient coming
    back, both the size of that block's `out_bytes` of fp32 (see the module docstring)."""

    encode_act: float
    act_wire: float
    act_latency: float
    decode_act: float
    encode_grad: float
    grad_wire: float
    grad_latency: float
    decode_grad: float


def boundary(profile: Profile, cut: int, level: LinkLevel, busy: int, fwd_codec: CodecCost,
             bwd_codec: CodecCost) -> Boundary:
    """The costs of the cut before block `cut` on `level` with `busy` ranks sharing cores."""
    n = profile.blocks[cut - 1].out_bytes
    load = level.load(busy)
    enc_a, wire_a, lat_a = _send(level, busy, fwd_codec, n)
    enc_g, wire_g, lat_g = _send(level, busy, bwd_codec, n)
    return Boundary(enc_a, wire_a, lat_a, load * fwd_codec.decode_s(n),
                    enc_g, wire_g, lat_g, load * bwd_codec.decode_s(n))


def accumulate_s(acc_s: float, replicas: int, microbatches: int) -> float:
    """Mean seconds a stage's backward adds by accumulating: of a replica's ceil(M / r)
    micro-batches all but the first add into existing gradients (`acc_s`: the stage's
    blocks' sum), spread evenly over its backwards."""
    mine = math.ceil(microbatches / replicas)
    return acc_s * (mine - 1) / mine


def replica_allreduce_s(profile: Profile, stage: Stage, level: LinkLevel, algorithm: str,
                        codec: CodecCost, busy: int) -> float:
    """The all-reduce of the stage's parameters over its replicas (0 for one replica)."""
    if stage.replicas == 1:
        return 0.0
    values = -(-sum(b.param_bytes for b in profile.blocks[stage.first:stage.end]) // 4)
    return allreduce_time(level, algorithm, stage.replicas, values, codec, busy=busy)


def stage_durations(profile: Profile, plan: PipelinePlan, network: Network,
                    compute_scale: float = 1.0, overhead: RuntimeOverhead = NONE,
                    sync_scale: float | None = None) -> StageDurations:
    """Each stage's `StageTimes` under `plan` on `network` (see the module docstring), its
    compute and the engine's per-action work `compute_scale` times the profile's and
    `overhead.action_s`, the engine's passes over a replicated stage's gradients
    `sync_scale` times `overhead.dp_byte_s` per byte (default: `compute_scale`)."""
    plan.check_covers(profile)
    busy = network.busy(plan.world_size)
    p = len(plan.stages)
    out = []
    for s, st in enumerate(plan.stages):
        blocks = profile.blocks[st.first:st.end]
        fwd = compute_scale * (sum(b.fwd_s for b in blocks) + overhead.action_s)
        if s == p - 1:  # the loss of each micro-batch, over the model's output
            fwd += compute_scale * overhead.loss_s(blocks[-1].out_bytes)
        acc = compute_scale * accumulate_s(sum(b.acc_s for b in blocks), st.replicas,
                                           plan.microbatches)
        bwd = compute_scale * (sum(b.bwd_s for b in blocks) + overhead.action_s) + acc
        decode = 0.0
        times: dict[str, float] = {}
        if s > 0:  # receives the activation of blocks[first - 1], sends its gradient back
            cut = boundary(profile, st.first, network.level([*plan.slots(s - 1), *plan.slots(s)]),
                           busy, plan.fwd_codec, plan.bwd_codec)
            fwd += cut.decode_act
            times.update(send_grad=cut.encode_grad, grad_wire=cut.grad_wire,
                         grad_latency=cut.grad_latency)
        if s < p - 1:
            cut = boundary(profile, st.end, network.level([*plan.slots(s), *plan.slots(s + 1)]),
                           busy, plan.fwd_codec, plan.bwd_codec)
            decode = cut.decode_grad
            bwd += decode
            times.update(send_act=cut.encode_act, act_wire=cut.act_wire,
                         act_latency=cut.act_latency)
        times.update(split_backward_s(blocks, s == 0, compute_scale, overhead.action_s, acc,
                                      decode))
        level = network.level(plan.slots(s))
        times["all_reduce"] = replica_allreduce_s(profile, st, level, plan.algorithm,
                                                  plan.grad_codec, busy)
        if st.replicas > 1:  # the data-parallel engine's passes over the stage's gradients
            times["all_reduce"] += (compute_scale if sync_scale is None else sync_scale) \
                * overhead.dp_byte_s * sum(
                b.param_bytes for b in blocks)
        out.append(StageTimes(forward=fwd, backward=bwd, **times))
    return StageDurations(tuple(out))


def _send(level: LinkLevel, busy: int, codec: CodecCost,
          fp32_bytes: int) -> tuple[float, float, float]:
    """(encode seconds, link seconds, latency) of one message of `fp32_bytes` of fp32."""
    load = level.load(busy)
    wire = codec.wire_bytes(-(-fp32_bytes // 4))
    return (load * codec.encode_s(fp32_bytes),
            load * level.beta_s_per_byte * wire + level.link_beta_s_per_byte * wire,
            load * level.alpha_s + level.link_alpha_s)


def pipeline_time(profile: Profile, plan: PipelinePlan, network: Network,
                  optimizer_s: float = 0.0, overhead: RuntimeOverhead = NONE) -> PipelineTime:
    """Simulate `plan`'s schedule with its priced actions; the step time and its parts
    (`overhead`: the engine's work per action and per step, see the module docstring)."""
    if not (isinstance(optimizer_s, (int, float)) and math.isfinite(optimizer_s)
            and optimizer_s >= 0):
        raise ConfigError(f"optimizer_s = {optimizer_s!r} must be a finite number of seconds "
                          f">= 0")
    order, route = plan.order()
    cores = network.shared_cores(plan.world_size)  # None: a core per rank
    load = network.compute_load(plan.world_size)
    # on shared cores the simulation slows each forward and backward by the ranks
    # computing beside it, and each pays the switching between ranks; the all-reduces
    # and the step's own work keep the whole load
    per_action = replace(overhead, action_s=overhead.action_s + overhead.shared_action_s) \
        if cores else overhead
    durations = stage_durations(profile, plan, network, 1.0 if cores else load, per_action,
                                sync_scale=load)
    timeline = _run(order, plan, durations, route, cores)
    exposed = 0.0
    if any(st.all_reduce for st in durations.stages):
        free = StageDurations(tuple(_no_allreduce(st) for st in durations.stages))
        exposed = timeline.makespan - _run(order, plan, free, route, cores).makespan
    fixed = optimizer_s + load * overhead.pipeline_step_s
    return PipelineTime(timeline.makespan + fixed, timeline.makespan,
                        timeline.bubble_fraction(), exposed, optimizer_s,
                        plan.microbatches * profile.micro_batch_size, durations, timeline)


def _run(order: Order, plan: PipelinePlan, durations: StageDurations, route: Route,
         cores: int | None = None) -> Timeline:
    timeline = simulate(order, len(plan.stages), durations, route, cores)
    if not timeline.completed:  # the registered schedules never deadlock; a new one might
        raise ConfigError(f"schedule {plan.schedule!r} deadlocks on this plan: "
                          f"{timeline.stuck}; check it with approxdist schedule show")
    return timeline


def _no_allreduce(times: StageTimes) -> StageTimes:
    return StageTimes(**{**vars(times), "all_reduce": 0.0})
