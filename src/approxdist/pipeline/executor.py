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

Evaluation runs the list without its backwards (`forward_only`, which cannot deadlock).
A failed receive raises a `PipelineError` naming this stage, the action and the neighbour.
A rank holding several stages (ZB-V's chunks) sends each action to its stage's compute and
transport. Every action is a recorder span in seed 002's vocabulary (docs/tracing.md).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import torch

from approxdist.data_parallel.replicas import ReplicaReducer
from approxdist.errors import ApproxDistError
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.microbatch import Batch
from approxdist.pipeline.schedule.action import Action, Kind
from approxdist.pipeline.stage import StageCompute
from approxdist.pipeline.step import (
    Chunk,
    Handler,
    Receipt,
    StepResult,
    StepState,
    agree_shapes,
    forward_only,
    last_send_phase,
    lost_peer,
    new_step,
    weight_follows,
)
from approxdist.pipeline.transport import StageTransport
from approxdist.trace import phases as ph
from approxdist.trace.recorder import NULL_RECORDER, Recorder
from approxdist.trace.times import StepTimes


class PipelineExecutor:
    """Executes this rank's actions for each mini-batch; `orders(M)` gives the list for M.

    `chunks` are the stages the rank runs when it holds several (ZB-V), by stage; each
    action goes to its stage's compute and transport. `compute` is the one whose loss the
    rank reports (its last stage's), `transport` its first stage's."""

    def __init__(self, orders: Callable[[int], list[Action]], compute: StageCompute,
                 transport: StageTransport, num_microbatches: int,
                 rec: Recorder = NULL_RECORDER, grad_sync: ReplicaReducer | None = None,
                 chunks: Mapping[int, Chunk] | None = None) -> None:
        self.compute, self.transport = compute, transport
        self.chunks = dict(chunks) if chunks else {transport.stage: Chunk(compute, transport)}
        self.num_microbatches, self.rec, self.grad_sync = num_microbatches, rec, grad_sync
        self._orders = orders
        self.dynamic_shapes = False  # per-sample shapes may change (`agree_shapes`)
        self._cache: dict[tuple[int, bool], list[Action]] = {}
        self._times = StepTimes()
        self._index = 0  # the position in this rank's list of the action running
        self._running: list[Action] = []  # the list `_execute` runs
        self._at = 0  # and where in it
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

    def train_step(self, inputs: Batch | None, labels: torch.Tensor | None,
                   batch_size: int) -> StepResult:
        """Forward and backward of one mini-batch in M micro-batches; gradients accumulate.

        Stage 0 needs `inputs`, the last stage `labels`; every stage needs `batch_size`.
        """
        for ch in self.chunks.values():
            ch.compute.reset_step()
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
        """With `dynamic_shapes`, every stage learns this mini-batch's activation shapes;
        without, stage 0 checks the inputs keep their shape (`step.agree_shapes`)."""
        agree_shapes(self.chunks, inputs, self.dynamic_shapes)

    def _prepare(self, inputs: Batch | None, labels: torch.Tensor | None, batch_size: int,
                 num_microbatches: int) -> StepState:
        return new_step(inputs if self.is_first else None, labels if self.is_last else None,
                        batch_size, num_microbatches, self.is_first, self.is_last,
                        max(self.chunks))

    def _execute(self, actions: list[Action], handlers: Mapping[Kind, Handler],
                 step: StepState, only: Collection[tuple[str, int]] | None = None,
                 first_index: int = 0) -> StepTimes:
        """Run `actions` (this rank's list from `first_index` on: `_index` tracks the
        position for subclasses), then wait for the sends (`only` those: the stream)."""
        send0, decode0 = self._seconds()
        self._times = times = StepTimes()
        start = time.perf_counter()
        self._running = actions
        for i, action in enumerate(actions):
            self._index, self._at = first_index + i, i
            handlers[action.kind](action, step)
        t0 = time.perf_counter()
        try:
            with self.rec.span(last_send_phase(actions)), self.rec.span(ph.WAIT, on="sends"):
                for ch in self.chunks.values():
                    ch.transport.wait_sends(only)
        except (ApproxDistError, RuntimeError) as exc:
            last = actions[-1] if actions else Action(self.transport.stage, Kind.FORWARD, 0)
            raise self._lost(last, "its sends to be delivered", exc) from exc
        times.wait_s += time.perf_counter() - t0
        times.wall_s = time.perf_counter() - start
        send1, decode1 = self._seconds()
        decode = decode1 - decode0  # decoding ran inside the receive waits
        times.comm_s += send1 - send0 + decode
        times.wait_s -= decode
        return times

    def _seconds(self) -> tuple[float, float]:
        """Seconds spent posting sends and decoding receives so far, over the rank's stages."""
        return (sum(ch.transport.send_seconds for ch in self.chunks.values()),
                sum(ch.transport.decode_seconds for ch in self.chunks.values()))

    @property
    def is_first(self) -> bool:
        """Whether the rank runs the first stage (it feeds the inputs)."""
        return any(ch.transport.is_first for ch in self.chunks.values())

    @property
    def is_last(self) -> bool:
        """Whether the rank runs the last stage (it needs the labels, reports the loss)."""
        return any(ch.transport.is_last for ch in self.chunks.values())

    def _recv(self, a: Action, step: StepState) -> None:
        """`RF` / `RB`: post the receive of an activation / a gradient."""
        m, forward, t = a.microbatch, a.kind == Kind.RECV_ACT, self.chunks[a.stage].transport
        t0 = time.perf_counter()
        with self.rec.span(ph.RECEIVE_FOR if forward else ph.RECEIVE_BACK, mb=m):
            post = t.post_recv_act if forward else t.post_recv_grad
            (step.acts if forward else step.grads)[(a.stage, m)] = post(m, step.sizes[m])
        self._times.comm_s += time.perf_counter() - t0

    def _forward(self, a: Action, step: StepState) -> None:
        m = a.microbatch
        x = self._input(a, step)
        with self._computing(ph.RUN_FOR, m):
            self.chunks[a.stage].compute.forward(m, x, step.labels[m], step.weights[m])

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

    def _post_act(self, a: Action, x: torch.Tensor) -> None:
        with self.rec.span(ph.SEND_FOR, mb=a.microbatch):
            self.chunks[a.stage].transport.send_act(a.microbatch, x)

    def _send_grad(self, a: Action, step: StepState) -> None:
        with self.rec.span(ph.SEND_BACK, mb=a.microbatch):
            self.chunks[a.stage].transport.send_grad(a.microbatch,
                                                     step.outbox.pop((a.stage, a.microbatch)))

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
            step.outbox[(a.stage, m)] = self.chunks[a.stage].compute.evaluate(x, step.labels[m])

    def _eval_send(self, a: Action, step: StepState) -> None:
        self._post_act(a, step.outbox.pop((a.stage, a.microbatch)))

    def _input(self, a: Action, step: StepState) -> Any:
        """Micro-batch `a.microbatch`'s input: the data on the first stage, else the
        activation received from the stage before (waited for)."""
        m = a.microbatch
        if self.chunks[a.stage].transport.is_first:
            return step.inputs[m]
        return self._wait(a, step.acts.pop((a.stage, m)))

    @contextlib.contextmanager
    def _computing(self, phase: str, m: int) -> Iterator[None]:
        """A compute `phase` of micro-batch `m`, its seconds added to the step's compute."""
        t0 = time.perf_counter()
        with self.rec.span(phase, mb=m):
            yield
        self._times.compute_s += time.perf_counter() - t0

    def _wait(self, a: Action, handle: Receipt) -> torch.Tensor:
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
        t = self.chunks[a.stage].transport if a.stage in self.chunks else self.transport
        return lost_peer(t, a, what, exc)
