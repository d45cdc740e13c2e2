"""Per-stage action times and link costs for `simulate` (a cost model's view of a schedule).

`Durations` gives every forward one time, every backward another; a cost model needs each
stage's own times (unequal partitions), what a send keeps its rank busy for (encoding),
and how long its message then occupies the link and travels (alpha-beta, on the
boundary's link). `StageDurations` holds one `StageTimes` per stage:

    durations = StageDurations((StageTimes(forward=0.02, backward=0.04, act_wire=0.008),
                                StageTimes(forward=0.03, backward=0.05, grad_wire=0.008)))
    simulate(order, 2, durations).makespan

The link times belong to the sending stage: `act_wire` and `act_latency` are the
activation message of stage s to s+1, `grad_wire` and `grad_latency` the gradient message
of stage s to s-1. Posting a receive takes no time; decoding a received message is the
consumer's work (add it to that stage's forward or backward). A zero-bubble schedule's
split backward prices `I` at `backward_input` and `W` at `backward_weight` where given (a
profile's measured halves, whose sum may exceed `backward`: splitting has a cost), else `I`
at `input_share` of the backward and `W` at the rest (default half each, the paper's
T_B = T_W).
"""

from __future__ import annotations

from dataclasses import dataclass

from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.schedule.action import Action, Kind


@dataclass(frozen=True)
class StageTimes:
    """Seconds of each action of one stage, per micro-batch, and of its outgoing messages."""

    forward: float = 1.0
    backward: float = 1.0
    send_act: float = 0.0  # the rank is busy posting (encoding) an activation
    send_grad: float = 0.0  # ... a gradient
    act_wire: float = 0.0  # the link to stage s+1 is busy with one activation message
    act_latency: float = 0.0  # ... which then arrives this much later
    grad_wire: float = 0.0  # the link to stage s-1 is busy with one gradient message
    grad_latency: float = 0.0
    all_reduce: float = 0.0  # the replicas' gradient all-reduce (`AR`)
    input_share: float = 0.5  # a split backward's I takes this share of `backward`, W the rest
    backward_input: float | None = None  # a split backward's I, where measured
    backward_weight: float | None = None  # ... and its W

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value is not None and not value >= 0.0:
                raise PipelineError(f"stage time {name} = {value!r} must be a number of "
                                    f"seconds >= 0")
        if not self.input_share <= 1.0:
            raise PipelineError(f"input_share = {self.input_share!r} is the share of the "
                                f"backward that computes the input gradient: use 0..1")

    @property
    def split(self) -> tuple[float, float]:
        """Seconds of a split backward's `I` and `W` (see the module doc)."""
        if self.backward_input is not None and self.backward_weight is not None:
            return self.backward_input, self.backward_weight
        return (self.backward * self.input_share,
                self.backward * (1.0 - self.input_share))


@dataclass(frozen=True)
class StageDurations:
    """`StageTimes` per stage, indexed by the action's stage (replicas share their stage's)."""

    stages: tuple[StageTimes, ...]

    def _stage(self, action: Action) -> StageTimes:
        if not 0 <= action.stage < len(self.stages):
            raise PipelineError(f"action {action} is on stage {action.stage} but durations "
                                f"are given for {len(self.stages)} stage(s)")
        return self.stages[action.stage]

    def of(self, action: Action) -> float:
        times = self._stage(action)
        i, w = times.split
        return {Kind.FORWARD: times.forward, Kind.BACKWARD: times.backward,
                Kind.BACKWARD_INPUT: i, Kind.BACKWARD_WEIGHT: w,
                Kind.SEND_ACT: times.send_act, Kind.SEND_GRAD: times.send_grad,
                Kind.ALL_REDUCE: times.all_reduce}.get(action.kind, 0.0)

    def transfer(self, action: Action) -> tuple[float, float]:
        times = self._stage(action)
        if action.kind is Kind.SEND_ACT:
            return times.act_wire, times.act_latency
        if action.kind is Kind.SEND_GRAD:
            return times.grad_wire, times.grad_latency
        return 0.0, 0.0
