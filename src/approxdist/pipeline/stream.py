"""Runs an asynchronous schedule's stream on one rank, a trainer step at a time (PipeDream, 2BW).

An asynchronous schedule (`schedule.versions.AsyncSchedule`) is one list of actions per
rank over a stream of K mini-batches with no flush: here K is the trainer's steps per
epoch, so the pipeline fills once and drains once per epoch (before evaluation and the
checkpoint, which therefore never see a micro-batch in flight). Each trainer step hands
over one mini-batch and runs this rank's piece of the stream (`schedule.stream_cut`):
the longest prefix that needs no later mini-batch's data. What a piece leaves unfinished
(posted receives, activations kept for backward, sends whose receive the peer posts
later) carries over to the next step; buffers cycle through a window of micro-batches.

Weights follow the schedule's data: before each forward and backward the stage's
`WeightVersions` selects the version the schedule names (weight stashing), and after the
backward an `Update` names, the optimiser steps inside the piece (PipeDream: after every
backward; 2BW: once per mini-batch, with a gradient one version old). Versions no later
action uses are dropped as soon as their last user ran.

Replicated stages (hybrid, `schedule.dealing`): this rank is one slot, a replica of its
stage, and runs the items dealt to it (n mod r_s). Its step's gradient is taken after
its own last backward of the step, scaled to the items' share of the *stage's* step
(`stage_weights`: the last stage weighs each loss by its own step's samples) and set
aside; the schedule's `AR` (placed before the first action that uses the version the step
makes, so 2BW's next mini-batch runs meanwhile) sums the oldest one over the stage's
replicas through `reduce` (the hybrid engine's `DataParallel` on the replica group, op
sum: any algorithm, codec, link) and the optimiser steps on it, so the replicas of a stage
step in lockstep and stay identical.

The handlers are the flushed executor's (`executor.PipelineExecutor`); evaluation is its
forward-only pipeline over the newest weights. A step's loss is the summed per-sample
loss of the micro-batches whose forward the last stage ran during it, which may belong
to the previous mini-batch; `versions_of_step` says which weight versions produced it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from approxdist.data_parallel.replicas import ReplicaReducer
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.executor import PipelineExecutor, StepResult, StepState
from approxdist.pipeline.microbatch import Batch, microbatch_sizes
from approxdist.pipeline.schedule.action import Action, Kind
from approxdist.pipeline.schedule.stream_cut import buffer_window, send_waits, step_cuts
from approxdist.pipeline.schedule.versions import AsyncSchedule, Update, gradient_delays
from approxdist.pipeline.stage import StageCompute
from approxdist.pipeline.transport import StageTransport
from approxdist.pipeline.weights import WeightVersions
from approxdist.trace import phases as ph
from approxdist.trace.recorder import NULL_RECORDER, Recorder

_DIRECTION = {Kind.SEND_ACT: "act", Kind.SEND_GRAD: "grad"}


def stage_weights(schedule: AsyncSchedule, stage: int, sizes: dict[int, int]) -> dict[int, float]:
    """Each micro-batch's share of the samples of `stage`'s optimiser step that applies its
    gradient (PipeDream: its round of r_s micro-batches, one per replica; 2BW: the
    mini-batch), for the steps whose micro-batches are all in `sizes`. The k-th steps of a
    stage's replicas are one step of the stage."""
    weights: dict[int, float] = {}
    for steps in zip(*(schedule.updates[r] for r in schedule.slots_of(stage))):
        items = [n for u in steps for n in u.items]
        if all(n in sizes for n in items):
            total = sum(sizes[n] for n in items)
            weights.update({n: sizes[n] / total for n in items})
    return weights


def loss_weights_by_update(schedule: AsyncSchedule, sizes: dict[int, int]) -> dict[int, float]:
    """Each micro-batch's loss weight: its share of the samples of the last stage's step that
    applies its gradient (PipeDream: 1 on one replica, each micro-batch is a step of its
    own; 2BW: its share of the mini-batch), for the micro-batches in `sizes`."""
    return stage_weights(schedule, schedule.num_stages - 1, sizes)


def stage_delays(schedule: AsyncSchedule) -> list[int]:
    """Per stage, the most optimiser steps between the version a gradient was computed at
    and the version it updates (over the stage's replicas, which step alike): what the
    delay rule (`optim.delay`) lowers each stage's momentum for."""
    delays = gradient_delays(schedule)
    return [max(delays[r] for r in schedule.slots_of(s)) for s in range(schedule.num_stages)]


class StreamExecutor(PipelineExecutor):
    """This rank's piece of `schedule`'s stream per trainer step; `optimizer` (set by the
    engine with `bind`) steps the stage's newest weights where the schedule updates. `rank`
    is this rank's slot; `reduce` sums a replicated stage's gradients at each `AR`."""

    def __init__(self, schedule: AsyncSchedule, rank: int, flushed: Callable[[int], list[Action]],
                 compute: StageCompute, transport: StageTransport, weights: WeightVersions,
                 rec: Recorder = NULL_RECORDER, reduce: ReplicaReducer | None = None) -> None:
        super().__init__(flushed, compute, transport, schedule.stream.microbatches, rec)
        self.schedule, self.rank, self.weights = schedule, rank, weights
        self.stage, self.reduce = schedule.stage_of(rank), reduce
        if reduce is None and any(a.kind is Kind.ALL_REDUCE for a in schedule.order[rank]):
            raise PipelineError(f"stage {self.stage} is replicated in the {schedule.name} "
                                f"schedule but has no all-reduce; build it with replicas")
        #: micro-batch -> factor from the last stage's loss weight to this stage's step share
        self._scale: dict[int, float] = {}
        #: a replicated stage's steps between their backward and their `AR`, oldest first
        self._pending: deque[tuple[Update, list[torch.Tensor | None]]] = deque()
        self.order = schedule.order[rank]
        #: every rank's pieces (`schedule.stream_cut.step_cuts`); this rank's: `cuts`
        self.all_cuts = cuts = step_cuts(schedule)
        self.cuts = cuts[rank]
        self.waits = [{(_DIRECTION[a.kind], a.microbatch) for a in sends}
                      for sends in send_waits(schedule, cuts)[rank]]
        self.window = buffer_window(schedule, cuts)
        self.updates = {u.after: u for u in schedule.updates[rank]}
        last_use: dict[int, int] = {}
        for (r, i), v in schedule.versions.items():
            if r == rank:
                last_use[v] = max(i, last_use.get(v, -1))
        self.used = set(last_use)
        self.drop_after: dict[int, list[int]] = {}
        for v, i in last_use.items():
            self.drop_after.setdefault(i, []).append(v)
        self.optimizer: torch.optim.Optimizer | None = None
        self._state: StepState | None = None
        self._step = 0  # the stream's next mini-batch
        self._pos = 0   # the next action of this rank's list
        self._sample_loss = 0.0

    def bind(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimiser of this stage's (newest) weights."""
        self.optimizer = optimizer

    def stage_delays(self) -> list[int]:
        """`stage_delays` of this rank's schedule."""
        return stage_delays(self.schedule)

    @property
    def next_step(self) -> int:
        """The mini-batch of the stream the next `train_step` hands over."""
        return self._step

    @property
    def in_stream(self) -> bool:
        """Whether a stream has started and not drained (micro-batches may be in flight)."""
        return self._step > 0

    # -- one trainer step -----------------------------------------------------------------
    def train_step(self, inputs: Batch | None, labels: torch.Tensor | None,
                   batch_size: int) -> StepResult:
        """Hand over mini-batch b of the stream and run this rank's piece of it. `loss` is
        the summed per-sample loss of the micro-batches the last stage ran forward."""
        if self.optimizer is None:
            raise PipelineError("the asynchronous executor has no optimiser; call bind() first")
        k, m = self.schedule.stream.minibatches, self.schedule.stream.microbatches
        b = self._step
        if b == 0:
            self._begin_stream()
        state = self._state
        assert state is not None
        sizes = microbatch_sizes(batch_size, m)
        items = range(b * m, (b + 1) * m)
        known = [state.sizes.get(n) for n in items]
        if known[0] is not None and known != sizes:
            raise PipelineError(f"mini-batch {b} of the stream has {batch_size} samples "
                                f"(micro-batches {sizes}) where receives were posted for "
                                f"{known}: every mini-batch of an asynchronous stream has "
                                f"the same size")
        # receives of the next mini-batch may be posted during this step: same sizes
        state.sizes.update(zip(range(b * m, (b + 2) * m), sizes + sizes))
        loss_weights = loss_weights_by_update(self.schedule, dict(zip(items, sizes)))
        state.weights.update(loss_weights)
        mine = stage_weights(self.schedule, self.stage, dict(zip(items, sizes)))
        self._scale.update({n: w / loss_weights[n] for n, w in mine.items()})
        self.agree_shapes(inputs)  # a stream keeps its shapes (dynamic shapes are refused)
        step0 = self._prepare(inputs, labels, batch_size, m)
        state.inputs.update(zip(items, step0.inputs.values()))
        state.labels.update(zip(items, step0.labels.values()))
        self.compute.reset_step()
        self._sample_loss = 0.0
        end = self.cuts[b]
        actions = self.order[self._pos:end]
        # then the sends whose receive was posted in this step (all of them at the end)
        times = self._execute(actions, self._train, state,
                              self.waits[b] if b < k - 1 else None, first_index=self._pos)
        self._pos = end
        self._step = b + 1
        if self._step == k:
            self._end_stream()
        ran = sum(state.sizes[a.microbatch] for a in actions if a.kind is Kind.FORWARD)
        return StepResult(self._sample_loss, int(self.compute.correct), ran,
                          self.compute.memory.peak, times)

    def _begin_stream(self) -> None:
        self.transport.window = self.window
        self.weights.reset(keep_initial=0 in self.used)
        if 0 in self.weights.versions:
            self.compute.memory.exclude(self.weights.tensors(0))
        self._state = StepState(sizes={}, weights={}, inputs={}, labels={})
        self._pos = 0

    def _end_stream(self) -> None:
        """The stream drained: nothing in flight, every version but the module's dropped."""
        assert self._pos == len(self.order), "the last step runs the rest of the stream"
        assert not self._pending, "every step of a replicated stage met its AR"
        self._scale.clear()
        self.weights.reset(keep_initial=False)
        self.transport.window = 0
        self._state = None
        self._step = 0

    # -- compute with weight versions ------------------------------------------------------
    def _forward(self, a: Action, step: StepState) -> None:
        self.weights.current = self.schedule.versions[(self.rank, self._index)]
        n = a.microbatch
        before = float(self.compute.loss_sum) if self.transport.is_last else 0.0
        super()._forward(a, step)
        if self.transport.is_last:
            weight = step.weights[n]
            self._sample_loss += (float(self.compute.loss_sum) - before) / weight * step.sizes[n]
        step.labels.pop(n, None)
        step.inputs.pop(n, None)

    def _backward(self, a: Action, step: StepState) -> None:
        self.weights.current = self.schedule.versions[(self.rank, self._index)]
        super()._backward(a, step)
        self.weights.backward_done(a.microbatch)
        update = self.updates.get(self._index)
        grads = self.weights.take_gradient(update) if update is not None else []
        for v in self.drop_after.get(self._index, []):  # before the update makes a new one
            self.weights.drop(v)
        if update is None:
            return
        scale = self._scale.pop(update.items[0], 1.0)
        for n in update.items[1:]:
            assert abs(self._scale.pop(n, 1.0) - scale) < 1e-12, "one scale per replica step"
        if scale != 1.0:
            grads = [g.mul_(scale) if g is not None else None for g in grads]
        if self.reduce is None:
            self._update(update, grads)
        else:  # the schedule's AR (before the version's first use) sums and steps
            self._pending.append((update, grads))

    def _all_reduce(self, a: Action, step: StepState) -> None:
        """`AR`: sum the oldest pending step's gradient over the stage's replicas, then step."""
        assert self.reduce is not None and self._pending, f"{a} without a step"
        update, grads = self._pending.popleft()
        self.weights.load_gradient(grads)
        t0 = time.perf_counter()
        with self.rec.span(ph.SYNC, mb=a.microbatch), self.rec.span(ph.WAIT, on="replicas"):
            self.reduce.reduce_gradients()
            self.reduce.finish()
        self._times.wait_s += time.perf_counter() - t0
        self._update(update, self.weights.module_gradient())

    def _update(self, update: Update, grads: list[torch.Tensor | None]) -> None:
        assert self.optimizer is not None
        t0 = time.perf_counter()
        with self.rec.span(ph.OPTIMIZER, version=update.version):
            self.weights.update(update, grads, self.optimizer, keep=update.version in self.used)
        if update.version in self.weights.versions:
            self.compute.memory.exclude(self.weights.tensors(update.version))
        self._times.compute_s += time.perf_counter() - t0

    def summary(self) -> dict[str, Any]:
        return {"buffer_window": self.window, "peak_weight_version_bytes": self.weights.peak_bytes}
