"""Runs any valid schedule's action list on one rank (GPipe, PipeDream-Flush; seeds 000 and 002).

The executor follows the contract in docs/pipeline.md and nothing else: it never looks at
a schedule's name, only at the actions of this rank, in order.

* `RF`/`RB` post a sized receive through the stage's transport and return;
* `F`/`B` are the only blocking points: they wait for their receive, then compute;
  a split backward's `I` blocks like `B` and computes the input gradient only, its `W`
  (zero-bubble schedules) accumulates the weight gradients and never communicates;
* `SF`/`SB` post a send (encoded at once, so the tensor can be dropped) and return;
* `AR` (replicated stages only) waits for the all-reduce of the stage's gradients over
  its replicas (a `ReplicaReducer`, e.g. `DataParallel`): backwards before the last one run
  with the sync off and only accumulate; the last one's gradient hooks start the
  all-reduce bucket by bucket while that backward continues (seed 002's `_sync`); with
  a split backward every `W` only accumulates and the all-reduce starts after the last;
* at the end of a step every send is waited for; the caller then steps the optimiser.

Evaluation runs the same schedule with its backward actions removed (`forward_only`):
forwards depend only on earlier stages, so the filtered list cannot deadlock.
A receive that fails (a neighbour died, the link timed out) raises a `PipelineError`
naming this stage, the action and the neighbour stage and rank.

With a recorder (docs/tracing.md) every action is a span in seed 002's vocabulary:
posting and awaiting a receive are `receive_for` / `receive_back` (the blocked part a
`wait` inside), compute is `run_for` / `run_back`, posting a send `send_for` /
`send_back`, and the end-of-step wait for the sends a `wait` (`on="sends"`) inside the
phase of the last send.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from approxdist.data_parallel.replicas import ReplicaReducer
from approxdist.errors import ApproxDistError
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.microbatch import Batch, loss_weights, microbatch_sizes, split_batch
from approxdist.pipeline.schedule.action import Action, Kind
from approxdist.pipeline.stage import StageCompute
from approxdist.pipeline.transport import PendingRecv, StageTransport
from approxdist.trace import phases as ph
from approxdist.trace.recorder import NULL_RECORDER, Recorder
from approxdist.trace.times import StepTimes

FORWARD_KINDS = (Kind.FORWARD, Kind.SEND_ACT, Kind.RECV_ACT)


def forward_only(actions: list[Action]) -> list[Action]:
    """The forward part of a rank's action list (evaluation), in the same order."""
    return [a for a in actions if a.kind in FORWARD_KINDS]


def _last_send_phase(actions: list[Action]) -> str:
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
    """Per-step state: micro-batch data, posted receives, gradients waiting to be sent."""

    sizes: dict[int, int]
    weights: dict[int, float]
    inputs: dict[int, Any]
    labels: dict[int, Any]
    acts: dict[int, PendingRecv] = field(default_factory=dict)
    grads: dict[int, PendingRecv] = field(default_factory=dict)
    outbox: dict[int, torch.Tensor] = field(default_factory=dict)
    sync_after: int | None = None  # the micro-batch whose backward starts the all-reduce


Handler = Callable[[Action, StepState], None]


class PipelineExecutor:
    """Executes this rank's actions for each mini-batch; `orders(M)` gives the list for M."""

    def __init__(self, orders: Callable[[int], list[Action]], compute: StageCompute,
                 transport: StageTransport, num_microbatches: int,
                 rec: Recorder = NULL_RECORDER, grad_sync: ReplicaReducer | None = None) -> None:
        self.compute, self.transport = compute, transport
        self.num_microbatches, self.rec, self.grad_sync = num_microbatches, rec, grad_sync
        self._orders = orders
        #: per-sample shapes may change between mini-batches (`agree_shapes`)
        self.dynamic_shapes = False
        self._cache: dict[tuple[int, bool], list[Action]] = {}
        self._times = StepTimes()
        self._index = 0  # the position in this rank's list of the action running
        self._running: list[Action] = []  # the list `_execute` runs, at position `_at`
        self._at = 0
        self._train = {Kind.RECV_ACT: self._recv, Kind.RECV_GRAD: self._recv,
                       Kind.FORWARD: self._forward, Kind.BACKWARD: self._backward,
                       Kind.BACKWARD_INPUT: self._backward_input,
                       Kind.BACKWARD_WEIGHT: self._backward_weight,
                       Kind.SEND_ACT: self._send_act, Kind.SEND_GRAD: self._send_grad,
                       Kind.ALL_REDUCE: self._all_reduce}
        self._eval = {Kind.RECV_ACT: self._recv, Kind.FORWARD: self._eval_forward,
                      Kind.SEND_ACT: self._eval_send}

    def actions(self, num_microbatches: int, train: bool = True) -> list[Action]:
        key = (num_microbatches, train)
        if key not in self._cache:
            actions = list(self._orders(num_microbatches))
            self._cache[key] = actions if train else forward_only(actions)
        return self._cache[key]

    # -- steps ------------------------------------------------------------------------
    def train_step(self, inputs: Batch | None, labels: torch.Tensor | None,
                   batch_size: int) -> StepResult:
        """Forward and backward of one mini-batch in M micro-batches; gradients accumulate.

        Stage 0 needs `inputs`, the last stage `labels`; every stage needs `batch_size`.
        """
        self.compute.reset_step()
        self.agree_shapes(inputs)
        step = self._prepare(inputs, labels, batch_size, self.num_microbatches)
        actions = self.actions(len(step.sizes))
        sync = [a for a in actions if a.kind is Kind.ALL_REDUCE]
        if sync and self.grad_sync is None:
            raise PipelineError(f"the schedule of stage {self.transport.stage} has {sync[0]} "
                                f"but the stage has no gradient sync; build it with replicas")
        step.sync_after = sync[0].microbatch if sync else None
        self.transport.courier.begin(len(step.sizes), train=True)
        times = self._execute(actions, self._train, step)
        c = self.compute
        ran = sum(step.sizes[a.microbatch] for a in actions if a.kind is Kind.FORWARD)
        return StepResult(float(c.loss_sum), int(c.correct), ran, c.memory.peak, times)

    @torch.no_grad()
    def eval_batch(self, inputs: Batch | None, labels: torch.Tensor | None,
                   batch_size: int) -> int:
        """Forward-only pipeline over one test batch; the last stage adds loss and hits to
        `compute.loss_sum` / `compute.correct` (reset them with `compute.reset_step()`).
        Returns the samples of the micro-batches this rank ran."""
        m = min(self.num_microbatches, batch_size)
        self.agree_shapes(inputs)
        step = self._prepare(inputs, labels, batch_size, m)
        actions = self.actions(m, train=False)
        self.transport.courier.begin(m, train=False)
        self._execute(actions, self._eval, step)
        return sum(step.sizes[a.microbatch] for a in actions if a.kind is Kind.FORWARD)

    def agree_shapes(self, inputs: Batch | None) -> None:
        """With `dynamic_shapes`, every stage learns this mini-batch's activation shapes
        (one header per boundary, `transport.refresh_shapes`); without, stage 0 checks
        that the inputs keep the shape the pipeline was built for."""
        t = self.transport
        shape = tuple(inputs.shape[1:]) if isinstance(inputs, torch.Tensor) else None
        if self.dynamic_shapes:
            t.refresh_shapes(shape if shape is not None else t.in_shape)
        elif t.is_first and shape is not None and shape != t.in_shape:
            raise PipelineError(f"the inputs' per-sample shape {shape} differs from the "
                                f"{t.in_shape} the pipeline was built for; shapes that change "
                                f"between mini-batches need dynamic_shapes=True "
                                f"(pipeline.dynamic_shapes)")

    def _prepare(self, inputs: Batch | None, labels: torch.Tensor | None, batch_size: int,
                 num_microbatches: int) -> StepState:
        sizes = microbatch_sizes(batch_size, num_microbatches)
        none: list[Any] = [None] * num_microbatches
        if self.transport.is_first:
            if inputs is None:
                raise PipelineError("stage 0 is the first stage and needs the inputs of every "
                                    "mini-batch")
            xs: list[Any] = split_batch(inputs, num_microbatches)
        else:
            xs = none
        if self.transport.is_last:
            if labels is None:
                raise PipelineError(f"stage {self.transport.stage} is the last stage and needs "
                                    "the labels of every mini-batch")
            ys: list[Any] = list(torch.split(labels, sizes))
        else:
            ys = none
        return StepState(dict(enumerate(sizes)), dict(enumerate(loss_weights(sizes))),
                     dict(enumerate(xs)), dict(enumerate(ys)))

    def _execute(self, actions: list[Action], handlers: Mapping[Kind, Handler],
                 step: StepState, only: Collection[tuple[str, int]] | None = None,
                 first_index: int = 0) -> StepTimes:
        """Run `actions` (this rank's list from `first_index` on: `_index` tracks the
        position for subclasses), then wait for the sends (`only` those: the stream)."""
        t = self.transport
        send0, decode0 = t.send_seconds, t.decode_seconds
        self._times = times = StepTimes()
        start = time.perf_counter()
        self._running = actions
        for i, action in enumerate(actions):
            self._index, self._at = first_index + i, i
            handlers[action.kind](action, step)
        t0 = time.perf_counter()
        try:
            with self.rec.span(_last_send_phase(actions)), self.rec.span(ph.WAIT, on="sends"):
                t.wait_sends(only)
        except (ApproxDistError, RuntimeError) as exc:
            last = actions[-1] if actions else Action(t.stage, Kind.FORWARD, 0)
            raise self._lost(last, "its sends to be delivered", exc) from exc
        times.wait_s += time.perf_counter() - t0
        times.wall_s = time.perf_counter() - start
        decode = t.decode_seconds - decode0  # decoding ran inside the receive waits
        times.comm_s += t.send_seconds - send0 + decode
        times.wait_s -= decode
        return times

    # -- action handlers ----------------------------------------------------------------
    def _recv(self, a: Action, step: StepState) -> None:
        """`RF` / `RB`: post the receive of an activation / a gradient."""
        m, forward = a.microbatch, a.kind == Kind.RECV_ACT
        t0 = time.perf_counter()
        with self.rec.span(ph.RECEIVE_FOR if forward else ph.RECEIVE_BACK, mb=m):
            post = self.transport.post_recv_act if forward else self.transport.post_recv_grad
            (step.acts if forward else step.grads)[m] = post(m, step.sizes[m])
        self._times.comm_s += time.perf_counter() - t0

    def _forward(self, a: Action, step: StepState) -> None:
        m = a.microbatch
        x = self._input(a, step)
        with self._computing(ph.RUN_FOR, m):
            self.compute.forward(m, x, step.labels[m], step.weights[m])

    def _backward(self, a: Action, step: StepState) -> None:
        m = a.microbatch
        grad = None if self.transport.is_last else self._wait(a, step.grads.pop(m))
        only_accumulate = self.grad_sync is not None and m != step.sync_after
        with self._computing(ph.RUN_BACK, m), self._sync_off(only_accumulate):
            grad_in = self.compute.backward(m, grad)
        if grad_in is not None:
            step.outbox[m] = grad_in

    def _backward_input(self, a: Action, step: StepState) -> None:
        """`I`: the input gradient of micro-batch m, to send; parameters untouched."""
        m = a.microbatch
        grad = None if self.transport.is_last else self._wait(a, step.grads.pop(m))
        with self._computing(ph.RUN_BACK, m):
            grad_in = self.compute.backward_input(m, grad)
        if grad_in is not None:
            step.outbox[m] = grad_in

    def _backward_weight(self, a: Action, step: StepState) -> None:
        """`W`: accumulate micro-batch m's weight gradients (one autograd pass per group of
        parameters, so the replicas' all-reduce starts after the last `W`, not in hooks).
        When the stage's next compute is another `W`, the fused layers' GEMMs wait for it
        and run as one (`StageCompute.flush_weights`)."""
        m = a.microbatch
        flush = m == step.sync_after or not self._weight_follows(a)
        with self._computing(ph.RUN_BACK, m), self._sync_off(True):
            self.compute.backward_weight(m, flush=flush)
        if self.grad_sync is not None and m == step.sync_after:
            self.grad_sync.reduce_gradients()

    def _weight_follows(self, a: Action) -> bool:
        """Whether this rank's next compute after `a` is a `W` of the same stage."""
        later = (b for b in self._running[self._at + 1:] if b.is_compute)
        nxt = next(later, None)
        return nxt is not None and nxt.kind is Kind.BACKWARD_WEIGHT and nxt.stage == a.stage

    def _send_act(self, a: Action, step: StepState) -> None:
        with self.rec.span(ph.SEND_FOR, mb=a.microbatch):
            self.transport.send_act(a.microbatch, self.compute.output(a.microbatch))

    def _send_grad(self, a: Action, step: StepState) -> None:
        with self.rec.span(ph.SEND_BACK, mb=a.microbatch):
            self.transport.send_grad(a.microbatch, step.outbox.pop(a.microbatch))

    def _sync_off(self, off: bool) -> contextlib.AbstractContextManager[None]:
        return self.grad_sync.no_sync() if off and self.grad_sync else contextlib.nullcontext()

    def _all_reduce(self, a: Action, step: StepState) -> None:
        """`AR`: wait for the stage's gradient all-reduce (seed 002's `_sync`)."""
        assert self.grad_sync is not None
        t0 = time.perf_counter()
        with self.rec.span(ph.SYNC, mb=a.microbatch), self.rec.span(ph.WAIT, on="replicas"):
            self.grad_sync.finish()
        self._times.wait_s += time.perf_counter() - t0

    def _eval_forward(self, a: Action, step: StepState) -> None:
        m = a.microbatch
        x = self._input(a, step)
        with self._computing(ph.RUN_FOR, m):
            step.outbox[m] = self.compute.evaluate(x, step.labels[m])

    def _eval_send(self, a: Action, step: StepState) -> None:
        with self.rec.span(ph.SEND_FOR, mb=a.microbatch):
            self.transport.send_act(a.microbatch, step.outbox.pop(a.microbatch))

    def _input(self, a: Action, step: StepState) -> Any:
        """Micro-batch `a.microbatch`'s input: the data on the first stage, else the
        activation received from the stage before (waited for)."""
        m = a.microbatch
        return step.inputs[m] if self.transport.is_first else self._wait(a, step.acts.pop(m))

    @contextlib.contextmanager
    def _computing(self, phase: str, m: int) -> Iterator[None]:
        """A compute `phase` of micro-batch `m`, its seconds added to the step's compute."""
        t0 = time.perf_counter()
        with self.rec.span(phase, mb=m):
            yield
        self._times.compute_s += time.perf_counter() - t0

    # -- waiting ------------------------------------------------------------------------
    def _wait(self, a: Action, handle: PendingRecv) -> torch.Tensor:
        """The received tensor of `a`'s micro-batch: a `wait` inside its receive phase."""
        phase = ph.RECEIVE_FOR if a.kind == Kind.FORWARD else ph.RECEIVE_BACK
        t0 = time.perf_counter()
        try:
            with self.rec.span(phase, mb=a.microbatch), self.rec.span(ph.WAIT):
                x = handle.wait()
        except (ApproxDistError, RuntimeError) as exc:
            what = "the activation" if a.kind == Kind.FORWARD else "the gradient"
            raise self._lost(a, f"{what} of micro-batch {a.microbatch}", exc) from exc
        self._times.wait_s += time.perf_counter() - t0
        return x

    def _lost(self, a: Action, what: str, exc: BaseException) -> PipelineError:
        t = self.transport
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
