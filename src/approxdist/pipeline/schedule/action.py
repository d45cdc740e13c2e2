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
Zero-bubble schedules (Qi et al. ICLR 2024) split a backward `B` into `I`, the input
gradient (what the previous stage waits for: it consumes the `RB` and feeds the `SB`), and
`W`, the weight gradient, which never communicates and fills idle slots: `1I0 1SB0 ... 1W0`.
A micro-batch has either one `B` or one `I` and one `W` on a stage. An asynchronous stream
(PipeDream, 2BW) also carries its weights as actions, whose number is a weight version, not
a micro-batch: `V` selects the version the stage's next forwards and backwards use (`0V1`:
"stage 0 runs on version 1 from here"), `U` is the stage's optimizer step (`0U2`: "stage 0
steps its optimizer, making version 2"); `schedule.program` places them.
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
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"
    SEND_ACT = "SF"
    RECV_ACT = "RF"
    SEND_GRAD = "SB"
    RECV_GRAD = "RB"
    ALL_REDUCE = "AR"
    VERSION = "V"
    UPDATE = "U"


COMPUTE = (Kind.FORWARD, Kind.BACKWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT)
#: the computes that consume a received gradient and produce the one sent back
GRAD_COMPUTE = (Kind.BACKWARD, Kind.BACKWARD_INPUT)
#: the computes after which a micro-batch's activations are no longer held
RELEASES = (Kind.BACKWARD, Kind.BACKWARD_WEIGHT)
SENDS = (Kind.SEND_ACT, Kind.SEND_GRAD)
RECVS = (Kind.RECV_ACT, Kind.RECV_GRAD)
#: the actions whose number is a weight version, not a micro-batch
WEIGHT_KINDS = (Kind.VERSION, Kind.UPDATE)

_PATTERN = re.compile(r"(\d+)(F|B|I|W|SF|RF|SB|RB|AR|V|U)(\d+)")


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

    def compute(self, split: bool = False) -> Action:
        """For a send, the compute that produces its data; for a receive, the consumer
        (`split`: the micro-batch's backward is split, so a gradient's is its `I`)."""
        if self.kind in (Kind.SEND_ACT, Kind.RECV_ACT):
            return Action(self.stage, Kind.FORWARD, self.microbatch)
        return Action(self.stage, Kind.BACKWARD_INPUT if split else Kind.BACKWARD,
                      self.microbatch)


def is_split(actions: list[Action]) -> bool:
    """Whether a rank's list splits its backwards (has `I` or `W` actions)."""
    return any(a.kind in (Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT) for a in actions)


def live_change(action: Action) -> int:
    """+1 when `action` starts holding a micro-batch's activations (a forward), -1 when it
    frees them (a whole backward, or a split backward's `W`), else 0."""
    return 1 if action.kind is Kind.FORWARD else -1 if action.kind in RELEASES else 0


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
