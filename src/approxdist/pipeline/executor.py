"""Runs any valid action list on one rank: flushed, zero-bubble and asynchronous (seeds 000, 002).

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
* `V` and `U` (asynchronous streams, `schedule.program`): select the weight version the
  next computes run on, step the stage's optimiser (`stream_state.StreamState`), whose
  `AR` sums the step's gradient over the replicas first;
* a flushed step runs the whole list and waits for every send, the caller then steps the
  optimiser; a stream's step runs its piece of the stream's list the same way.

Evaluation runs the list without its backwards (`forward_only`, which cannot deadlock).
A failed receive raises a `PipelineError` naming this stage, the action and the neighbour.
A rank holding several stages (ZB-V's chunks) sends each action to its stage's compute and
transport. Every action is a recorder span in seed 002's vocabulary (docs/tracing.md).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from approxdist.data_parallel.replicas import ReplicaReducer
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.microbatch import Batch
from approxdist.pipeline.schedule.action import Action, Kind
from approxdist.pipeline.stage import StageCompute
from approxdist.pipeline.step import (
    Chunk,
    Handler,
    Piece,
    StepResult,
    StepState,
    forward_only,
    weight_follows,
)
from approxdist.pipeline.step_runner import StepRunner
from approxdist.pipeline.stream_state import StreamState
from approxdist.pipeline.transport import StageTransport
from approxdist.trace import phases as ph
from approxdist.trace.recorder import NULL_RECORDER, Recorder

__all__ = ["PipelineExecutor", "StepResult", "StepState", "forward_only"]


class PipelineExecutor(StepRunner):
    """Executes this rank's actions for each mini-batch; `orders(M)` gives the list for M
    (with a `stream`, the list evaluation runs; training runs the stream's pieces).

    `chunks` are the stages the rank runs when it holds several (ZB-V), by stage; each
    action goes to its stage's compute and transport. `compute` is the one whose loss the
    rank reports (its last stage's), `transport` its first stage's."""

    def __init__(self, orders: Callable[[int], list[Action]], compute: StageCompute,
                 transport: StageTransport, num_microbatches: int,
                 rec: Recorder = NULL_RECORDER, grad_sync: ReplicaReducer | None = None,
                 chunks: Mapping[int, Chunk] | None = None,
                 stream: StreamState | None = None) -> None:
        super().__init__(compute, transport, rec, chunks)
        self.num_microbatches, self.grad_sync, self.stream = num_microbatches, grad_sync, stream
        self._orders = orders
        self._cache: dict[tuple[int, bool], list[Action]] = {}
        self._train: dict[Kind, Handler] = {
            Kind.RECV_ACT: self._recv, Kind.RECV_GRAD: self._recv, Kind.FORWARD: self._forward,
            Kind.BACKWARD: self._backward, Kind.BACKWARD_INPUT: self._backward_input,
            Kind.BACKWARD_WEIGHT: self._backward_weight, Kind.SEND_ACT: self._send_act,
            Kind.SEND_GRAD: self._send_grad, Kind.ALL_REDUCE: self._all_reduce,
            Kind.VERSION: self._version, Kind.UPDATE: self._update}
        self._eval: dict[Kind, Handler] = {Kind.RECV_ACT: self._recv,
                                           Kind.FORWARD: self._eval_forward,
                                           Kind.SEND_ACT: self._eval_send}

    def actions(self, num_microbatches: int, train: bool = True) -> list[Action]:
        key = (num_microbatches, train)
        if key not in self._cache:
            actions = list(self._orders(num_microbatches))
            self._cache[key] = actions if train else forward_only(actions)
        return self._cache[key]

    def train_step(self, inputs: Batch | None, labels: torch.Tensor | None,
                   batch_size: int) -> StepResult:
        """Forward and backward of one mini-batch in M micro-batches; gradients accumulate
        (a stream: hand over the mini-batch and run this rank's piece of the stream, whose
        `loss` is the summed per-sample loss of the micro-batches the last stage ran).

        Stage 0 needs `inputs`, the last stage `labels`; every stage needs `batch_size`.
        """
        for ch in self.chunks.values():
            ch.compute.reset_step()
        self.agree_shapes(inputs)
        step = self._prepare(inputs, labels, batch_size, self.num_microbatches)
        piece = self.stream.piece(step, batch_size) if self.stream is not None \
            else self._flushed(step)
        times = self._execute(piece.actions, self._train, piece.state, piece.waits, piece.first)
        c, sizes = self.compute, piece.state.sizes
        ran = self._ran(piece.actions, sizes)
        loss = self.stream.finish(piece) if self.stream is not None else float(c.loss_sum)
        return StepResult(loss, int(c.correct), ran, c.memory.peak, times)

    def _flushed(self, step: StepState) -> Piece:
        """A flushed step: this rank's whole list for the mini-batch's micro-batches."""
        actions = self.actions(len(step.sizes))
        sync = [a for a in actions if a.kind is Kind.ALL_REDUCE]
        if sync and self.grad_sync is None:
            raise PipelineError(f"the schedule of stage {self.transport.stage} has {sync[0]} "
                                f"but the stage has no gradient sync; build it with replicas")
        step.sync_after = sync[0].microbatch if sync else None
        self.transport.courier.begin(len(step.sizes), train=True)
        return Piece(actions, step)

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
        return self._ran(actions, step.sizes)

    def _ran(self, actions: Sequence[Action], sizes: Mapping[int, int]) -> int:
        """The samples this rank ran in `actions`: each micro-batch once, through the first
        of its chunks (ZB-V's rank 0 forwards every micro-batch twice, chunks 0 and 2P-1)."""
        first = min(self.chunks)
        return sum(sizes[a.microbatch] for a in actions
                   if a.kind is Kind.FORWARD and a.stage == first)

    def _forward(self, a: Action, step: StepState) -> None:
        m, compute = a.microbatch, self.chunks[a.stage].compute
        x = self._input(a, step)
        kept = step.item_loss is not None and compute.is_last  # a stream's loss per item
        before = float(compute.loss_sum) if kept else 0.0
        with self._computing(ph.RUN_FOR, m):
            compute.forward(m, x, step.labels[m], step.weights[m])
        if step.item_loss is not None:  # a stream's state outlives the step: drop m's data
            step.labels.pop(m)
            step.inputs.pop(m, None)
            if kept:
                step.item_loss[m] = float(compute.loss_sum) - before

    def _grad(self, a: Action, step: StepState) -> torch.Tensor | None:
        """The received gradient of `a`'s output (None on the last stage)."""
        last = self.chunks[a.stage].transport.is_last
        return None if last else self._wait(a, step.grads.pop((a.stage, a.microbatch)))

    def _backward(self, a: Action, step: StepState) -> None:
        m = a.microbatch
        grad = self._grad(a, step)
        only_accumulate = self.grad_sync is not None and m != step.sync_after
        with self._computing(ph.RUN_BACK, m), self._sync_off(only_accumulate):
            grad_in = self.chunks[a.stage].compute.backward(m, grad)
        if self.stream is not None:
            self.stream.after_backward(self._index, m)
        if grad_in is not None:
            step.outbox[(a.stage, m)] = grad_in

    def _backward_input(self, a: Action, step: StepState) -> None:
        """`I`: the input gradient of micro-batch m, to send; parameters untouched."""
        m = a.microbatch
        grad = self._grad(a, step)
        with self._computing(ph.RUN_BACK, m):
            grad_in = self.chunks[a.stage].compute.backward_input(m, grad)
        if grad_in is not None:
            step.outbox[(a.stage, m)] = grad_in

    def _backward_weight(self, a: Action, step: StepState) -> None:
        """`W`: accumulate micro-batch m's weight gradients (one autograd pass per group of
        parameters, so the replicas' all-reduce starts after the last `W`, not in hooks).
        When the stage's next compute is another `W`, the fused layers' GEMMs wait for it
        and run as one (`StageCompute.flush_weights`)."""
        m = a.microbatch
        flush = m == step.sync_after or not weight_follows(self._running, self._at, a)
        with self._computing(ph.RUN_BACK, m), self._sync_off(True):
            self.chunks[a.stage].compute.backward_weight(m, flush=flush)
        if self.grad_sync is not None and m == step.sync_after:
            self.grad_sync.reduce_gradients()

    def _send_act(self, a: Action, step: StepState) -> None:
        self._post_act(a, self.chunks[a.stage].compute.output(a.microbatch))

    def _send_grad(self, a: Action, step: StepState) -> None:
        with self.rec.span(ph.SEND_BACK, mb=a.microbatch):
            self.chunks[a.stage].transport.send_grad(a.microbatch,
                                                     step.outbox.pop((a.stage, a.microbatch)))

    def _sync_off(self, off: bool) -> contextlib.AbstractContextManager[None]:
        return self.grad_sync.no_sync() if off and self.grad_sync else contextlib.nullcontext()

    def _all_reduce(self, a: Action, step: StepState) -> None:
        """`AR`: wait for the stage's gradient all-reduce (seed 002's `_sync`); in a stream,
        sum the pending step's gradient over the replicas (its `U` follows)."""
        t0 = time.perf_counter()
        with self.rec.span(ph.SYNC, mb=a.microbatch), self.rec.span(ph.WAIT, on="replicas"):
            if self.stream is not None:
                self.stream.all_reduce()
            else:
                assert self.grad_sync is not None
                self.grad_sync.finish()
        self._times.wait_s += time.perf_counter() - t0

    def _version(self, a: Action, step: StepState) -> None:
        """`V`: the stream's next forwards and backwards run on weight version `a`'s number."""
        assert self.stream is not None, f"{a} outside a stream"
        self.stream.select(a.microbatch)

    def _update(self, a: Action, step: StepState) -> None:
        """`U`: the stream's optimiser step making version `a`'s number."""
        assert self.stream is not None, f"{a} outside a stream"
        t0 = time.perf_counter()
        with self.rec.span(ph.OPTIMIZER, version=a.microbatch):
            self.stream.update(a.microbatch)
        self._times.compute_s += time.perf_counter() - t0

    def _eval_forward(self, a: Action, step: StepState) -> None:
        m = a.microbatch
        x = self._input(a, step)
        with self._computing(ph.RUN_FOR, m):
            step.outbox[(a.stage, m)] = self.chunks[a.stage].compute.evaluate(x, step.labels[m])

    def _eval_send(self, a: Action, step: StepState) -> None:
        self._post_act(a, step.outbox.pop((a.stage, a.microbatch)))
