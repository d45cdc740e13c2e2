"""Runs a list of actions on one rank, timed and traced: the executor's plumbing (seed 002).

`StepRunner` holds the stages (chunks) a rank runs, posts and waits for their transfers
(a failed receive is a `PipelineError` naming the stage, the action and the neighbour),
times every action into the step's compute / communication / wait seconds, records it
as a span in seed 002's vocabulary (docs/tracing.md), and waits for the sends at the end
of a list. What each compute action does is `executor.PipelineExecutor`'s.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import torch

from approxdist.errors import ApproxDistError
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.microbatch import Batch
from approxdist.pipeline.schedule.action import Action, Kind
from approxdist.pipeline.stage import StageCompute
from approxdist.pipeline.step import (
    Chunk,
    Handler,
    Receipt,
    StepState,
    agree_shapes,
    last_send_phase,
    lost_peer,
    new_step,
)
from approxdist.pipeline.transport import StageTransport
from approxdist.trace import phases as ph
from approxdist.trace.recorder import Recorder
from approxdist.trace.times import StepTimes


class StepRunner:
    """The stages `chunks` (by stage; default the one of `compute` and `transport`) of a rank
    and the running of its actions; `compute` reports the rank's loss (its last stage's),
    `transport` is its first stage's."""

    def __init__(self, compute: StageCompute, transport: StageTransport, rec: Recorder,
                 chunks: Mapping[int, Chunk] | None = None) -> None:
        self.compute, self.transport, self.rec = compute, transport, rec
        self.chunks = dict(chunks) if chunks else {transport.stage: Chunk(compute, transport)}
        self.dynamic_shapes = False  # per-sample shapes may change (`agree_shapes`)
        self._times = StepTimes()
        self._index = 0  # the position in this rank's list of the action running
        self._running: list[Action] = []  # the list `_execute` runs
        self._at = 0  # and where in it

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

    def _post_act(self, a: Action, x: torch.Tensor) -> None:
        with self.rec.span(ph.SEND_FOR, mb=a.microbatch):
            self.chunks[a.stage].transport.send_act(a.microbatch, x)

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
