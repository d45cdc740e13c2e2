"""One step of a pipeline schedule, printed like torch.distributed.pipelining's `1F0`.

A schedule is data (seed 002, GPipe, PipeDream-Flush): per pipeline rank (a position in
the pipeline's group, not a global rank), a list of `Action`s.
`str(Action(1, Kind.FORWARD, 0)) == "1F0"` reads "stage 1, forward, micro-batch 0".
Communication actions use two-letter kinds: `SF`/`RF` send/receive a forward
activation, `SB`/`RB` send/receive a backward gradient, so `0SF2` is "stage 0 sends the
activation of micro-batch 2 to stage 1" and `1RB0` is "stage 1 receives the gradient of
micro-batch 0 from stage 2". The peer is implied: activations flow to stage + 1,
gradients to stage - 1. A replicated stage (hybrid parallelism, seed 002) ends its list
with `AR`, the all-reduce of its gradients over its replicas (seed 002's `_sync`):
`0AR6` is "stage 0 averages its gradients, the last micro-batch it ran being 6"; the
all-reduce starts during that micro-batch's backward and `AR` waits for it to finish.
See docs/pipeline.md for what an executor does with each kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from approxdist.pipeline.errors import ScheduleError


class Kind(Enum):
    """What an action does; the value is its short form in printed schedules."""

    FORWARD = "F"
    BACKWARD = "B"
    SEND_ACT = "SF"
    RECV_ACT = "RF"
    SEND_GRAD = "SB"
    RECV_GRAD = "RB"
    ALL_REDUCE = "AR"


COMPUTE = (Kind.FORWARD, Kind.BACKWARD)
SENDS = (Kind.SEND_ACT, Kind.SEND_GRAD)
RECVS = (Kind.RECV_ACT, Kind.RECV_GRAD)

_PATTERN = re.compile(r"(\d+)(F|B|SF|RF|SB|RB|AR)(\d+)")


@dataclass(frozen=True)
class Action:
    """Stage `stage` does `kind` for micro-batch `microbatch`."""

    stage: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    def __repr__(self) -> str:
        return f"Action({self})"

    @staticmethod
    def parse(text: str) -> Action:
        """`Action.parse("1F0")`; the inverse of `str`."""
        match = _PATTERN.fullmatch(text.strip())
        if match is None:
            raise ScheduleError(
                f"cannot parse action {text!r}; write <stage><kind><micro-batch> with kind "
                f"one of {', '.join(k.value for k in Kind)}, e.g. '1F0' or '0SF2'")
        stage, kind, mb = match.groups()
        return Action(int(stage), Kind(kind), int(mb))

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE

    @property
    def is_send(self) -> bool:
        return self.kind in SENDS

    @property
    def is_recv(self) -> bool:
        return self.kind in RECVS

    @property
    def peer_stage(self) -> int:
        """The stage a send goes to or a receive comes from."""
        if self.kind in (Kind.SEND_ACT, Kind.RECV_GRAD):
            return self.stage + 1
        if self.kind in (Kind.RECV_ACT, Kind.SEND_GRAD):
            return self.stage - 1
        raise ValueError(f"{self} is not a send or receive; it has no peer")

    @property
    def channel(self) -> tuple[int, int]:
        """(source stage, destination stage) of the message a send/receive moves."""
        if self.is_send:
            return (self.stage, self.peer_stage)
        return (self.peer_stage, self.stage)

    def matching(self) -> Action:
        """The action on the peer that pairs with this send or receive."""
        pair = {Kind.SEND_ACT: Kind.RECV_ACT, Kind.RECV_ACT: Kind.SEND_ACT,
                Kind.SEND_GRAD: Kind.RECV_GRAD, Kind.RECV_GRAD: Kind.SEND_GRAD}
        return Action(self.peer_stage, pair[self.kind], self.microbatch)

    def compute(self) -> Action:
        """For a send, the compute that produces its data; for a receive, the consumer."""
        is_act = self.kind in (Kind.SEND_ACT, Kind.RECV_ACT)
        return Action(self.stage, Kind.FORWARD if is_act else Kind.BACKWARD, self.microbatch)


#: pipeline rank -> the actions it executes, in order. A pipeline rank is a position in the
#: pipeline's group (member s runs stage s); which global rank holds it is the topology's
#: choice (`approxdist.topology`), resolved by the transport, never by the schedule.
Order = dict[int, list[Action]]


def parse_actions(text: str) -> list[Action]:
    """`parse_actions("0F0 0SF0 0RB0 0B0")`: a whitespace-separated list of actions."""
    return [Action.parse(word) for word in text.split()]


def format_actions(actions: list[Action]) -> str:
    """The inverse of `parse_actions`."""
    return " ".join(str(a) for a in actions)
