"""What one step of a pipeline rank carries: its state between actions, the piece of its list
it runs, its result, and the chunks (stages) the rank runs; pure bookkeeping for `executor`."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.microbatch import Batch, loss_weights, microbatch_sizes, split_batch
from approxdist.pipeline.schedule.action import Action, Kind
from approxdist.pipeline.stage import StageCompute
from approxdist.pipeline.transport import StageTransport
from approxdist.trace import phases as ph
from approxdist.trace.times import StepTimes


class Receipt(Protocol):
    """A posted receive (`transport.PendingRecv`, or a hand-over between chunks of a rank)."""

    def wait(self) -> torch.Tensor: ...


@dataclass
class Chunk:
    """One stage a rank runs: its compute and its transfers (ZB-V: two per rank)."""

    compute: StageCompute
    transport: StageTransport


FORWARD_KINDS = (Kind.FORWARD, Kind.SEND_ACT, Kind.RECV_ACT)


def forward_only(actions: list[Action]) -> list[Action]:
    """The forward part of a rank's action list (evaluation), in the same order."""
    return [a for a in actions if a.kind in FORWARD_KINDS]


def last_send_phase(actions: list[Action]) -> str:
    """The phase of the sends a step's final wait is for: its last send's (the report then
    says `wait in send_back`); `send_for` when the list sends nothing."""
    last = next((a for a in reversed(actions) if a.kind in (Kind.SEND_ACT, Kind.SEND_GRAD)), None)
    return ph.SEND_BACK if last is not None and last.kind == Kind.SEND_GRAD else ph.SEND_FOR


@dataclass(frozen=True)
class StepResult:
    """One mini-batch on this rank; `loss` and `correct` are meaningful on the last stage:
    `loss` is the weighted sum over this rank's micro-batches (weights = their share of the
    whole mini-batch), `samples` the samples of the micro-batches this rank ran."""

    loss: float
    correct: int
    samples: int
    peak_activation_bytes: int
    times: StepTimes


@dataclass
class StepState:
    """Per-step state: micro-batch data (by micro-batch), posted receives, gradients
    waiting to be sent."""

    sizes: dict[int, int]
    weights: dict[int, float]
    inputs: dict[int, Any]
    labels: dict[int, Any]
    #: posted receives and tensors to send, by (stage, micro-batch): a rank may hold chunks
    acts: dict[tuple[int, int], Receipt] = field(default_factory=dict)
    grads: dict[tuple[int, int], Receipt] = field(default_factory=dict)
    outbox: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    sync_after: int | None = None  # the micro-batch whose backward starts the all-reduce
    #: a stream's last stage: each micro-batch's weighted loss, by micro-batch (None: not kept)
    item_loss: dict[int, float] | None = None


@dataclass
class Piece:
    """What one trainer step runs on a rank: a flushed step's whole list, or a stream's
    piece of it (`actions` from position `first` of the rank's list, then a wait for the
    sends `waits`: (direction, micro-batch), None for every send)."""

    actions: list[Action]
    state: StepState
    first: int = 0
    waits: Collection[tuple[str, int]] | None = None


Handler = Callable[[Action, StepState], None]


def new_step(inputs: Batch | None, labels: torch.Tensor | None, batch_size: int,
             num_microbatches: int, is_first: bool, is_last: bool, last_stage: int) -> StepState:
    """A step's state: the inputs (first stage) and labels (last stage) cut in micro-batches."""
    sizes = microbatch_sizes(batch_size, num_microbatches)
    none: list[Any] = [None] * num_microbatches
    if is_first:
        if inputs is None:
            raise PipelineError("stage 0 is the first stage and needs the inputs of every "
                                "mini-batch")
        xs: list[Any] = split_batch(inputs, num_microbatches)
    else:
        xs = none
    if is_last:
        if labels is None:
            raise PipelineError(f"stage {last_stage} is the last stage and needs the labels of "
                                f"every mini-batch")
        ys: list[Any] = list(torch.split(labels, sizes))
    else:
        ys = none
    return StepState(dict(enumerate(sizes)), dict(enumerate(loss_weights(sizes))),
                     dict(enumerate(xs)), dict(enumerate(ys)))


def lost_peer(t: StageTransport, a: Action, what: str, exc: BaseException) -> PipelineError:
    """The error of stage `t.stage` stopped at `a` waiting for `what` from a neighbour."""
    peers = [s for s in (t.stage - 1, t.stage + 1) if 0 <= s < t.num_stages]
    if a.kind == Kind.FORWARD:
        peers = [t.stage - 1]
    elif a.kind in (Kind.BACKWARD, Kind.BACKWARD_INPUT):
        peers = [t.stage + 1]
    m = a.microbatch
    names = " or ".join(f"stage {s} (rank {t.global_rank(s, m)})" for s in peers)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    peer = getattr(exc, "peer", None)
    if peer is None and len(peers) == 1:
        peer = t.global_rank(peers[0], m)
    return PipelineError(f"stage {t.stage} (rank {t.link.me}) stopped at {a} waiting for "
                         f"{what} from {names}, which may have died: {first}", peer=peer)


def agree_shapes(chunks: dict[int, Chunk], inputs: Batch | None, dynamic: bool) -> None:
    """With `dynamic`, every stage of the rank learns this mini-batch's activation shapes
    (one header per boundary, `transport.refresh_shapes`, in stage order: shapes flow down
    the chunks); without, stage 0 checks that the inputs keep the shape the pipeline was
    built for."""
    t = chunks[min(chunks)].transport
    shape = tuple(inputs.shape[1:]) if isinstance(inputs, torch.Tensor) else None
    if dynamic:
        for stage in sorted(chunks):
            chunks[stage].transport.refresh_shapes(shape if shape is not None else t.in_shape)
    elif t.is_first and shape is not None and shape != t.in_shape:
        raise PipelineError(f"the inputs' per-sample shape {shape} differs from the "
                            f"{t.in_shape} the pipeline was built for; shapes that change "
                            f"between mini-batches need dynamic_shapes=True "
                            f"(pipeline.dynamic_shapes)")


def weight_follows(actions: list[Action], at: int, a: Action) -> bool:
    """Whether the next compute after position `at` is a `W` of `a`'s stage (its fused
    GEMMs can wait and run with that one's)."""
    nxt = next((b for b in itertools.islice(actions, at + 1, None) if b.is_compute), None)
    return nxt is not None and nxt.kind is Kind.BACKWARD_WEIGHT and nxt.stage == a.stage
