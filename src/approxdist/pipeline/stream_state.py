"""Where one rank is in an asynchronous stream between trainer steps, and its weights (PipeDream, 2BW).

An asynchronous schedule runs as one `schedule.program.StreamProgram` per rank over a
stream of K mini-batches (the trainer's steps per epoch), so the pipeline fills once and
drains once per epoch, before evaluation and the checkpoint (which never see a
micro-batch in flight). Each trainer step hands over one mini-batch and the executor runs
this rank's piece of the program (`piece`) as it runs a flushed step's list; what a piece
leaves unfinished (posted receives, activations kept for backward, sends whose receive
the peer posts later) stays in the state carried to the next piece, and the transfer
buffers cycle through the program's window.

The weights follow the program's actions: `V` selects the version the next computes run
on (`WeightVersions`, weight stashing); the backward that completes a step's gradient
takes it out of the version it was computed at, scaled to its micro-batches' share of the
stage's step; versions no later action uses are dropped; `U` steps the optimiser on the
module's (newest) weights with that gradient. On a replicated stage the `AR` before the
`U` sums it over the stage's replicas (`reduce`, the hybrid engine's `DataParallel` on
the replica group: any algorithm, codec, link), so the replicas step in lockstep. A
piece's loss is the summed per-sample loss of the micro-batches the last stage ran
forward in it (they may belong to the previous mini-batch).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from approxdist.data_parallel.replicas import ReplicaReducer
from approxdist.optim.delay import apply_delay_rule, delay_line
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.microbatch import microbatch_sizes
from approxdist.pipeline.schedule.action import Kind
from approxdist.pipeline.schedule.program import (
    StreamProgram,
    loss_weights_by_update,
    stage_delays,
    stage_weights,
)
from approxdist.pipeline.schedule.versions import Update
from approxdist.pipeline.stage import StageCompute
from approxdist.pipeline.step import Piece, StepState
from approxdist.pipeline.transport import StageTransport
from approxdist.pipeline.weights import StepGradient, WeightVersions

#: the optimiser of a stage, from its parameters
OptimizerFactory = Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer]


class StreamState:
    """Rank `program.rank`'s place in its stream and its stage's weights; `optimizer` (set
    with `bind`) steps the newest weights at each `U`."""

    def __init__(self, program: StreamProgram, weights: WeightVersions, compute: StageCompute,
                 transport: StageTransport, reduce: ReplicaReducer | None = None) -> None:
        self.program, self.weights, self.compute, self.transport = program, weights, compute, transport
        self.schedule, self.rank, self.stage = program.schedule, program.rank, program.stage
        if reduce is None and any(a.kind is Kind.ALL_REDUCE for a in program.actions):
            raise PipelineError(f"stage {self.stage} is replicated in the {self.schedule.name} "
                                f"schedule but has no all-reduce; build it with replicas")
        self.reduce = reduce
        self.optimizer: torch.optim.Optimizer | None = None
        #: micro-batch -> factor from the last stage's loss weight to this stage's step share
        self._scale: dict[int, float] = {}
        #: steps whose gradient is complete and not applied yet (a replicated one meets its
        #: `AR` first), oldest first
        self._pending: deque[tuple[Update, StepGradient]] = deque()
        self._state: StepState | None = None
        self._step = 0  # the stream's next mini-batch
        self._pos = 0   # the next action of the program

    def bind(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimiser of this stage's (newest) weights."""
        self.optimizer = optimizer

    def delays(self) -> list[int]:
        """`program.stage_delays` of the schedule: each stage's gradient delay."""
        return stage_delays(self.schedule)

    @property
    def next_step(self) -> int:
        """The mini-batch of the stream the next trainer step hands over."""
        return self._step

    @property
    def in_stream(self) -> bool:
        """Whether a stream has started and not drained (micro-batches may be in flight)."""
        return self._step > 0

    # -- the pieces ------------------------------------------------------------------------
    def piece(self, minibatch: StepState, batch_size: int) -> Piece:
        """Hand over the stream's next mini-batch (`minibatch`: its inputs and labels cut in
        micro-batches, `step.new_step`) and return this rank's piece for it."""
        if self.optimizer is None:
            raise PipelineError("the asynchronous stream has no optimiser; call bind() first")
        m, b = self.schedule.stream.microbatches, self._step
        if b == 0:
            self._begin()
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
        state.inputs.update(zip(items, minibatch.inputs.values()))
        state.labels.update(zip(items, minibatch.labels.values()))
        state.item_loss = {}
        end = self.program.cuts[b]
        piece = Piece(self.program.actions[self._pos:end], state, self._pos,
                      self.program.waits[b])
        self._pos = end
        return piece

    def finish(self, piece: Piece) -> float:
        """After `piece` ran: the summed per-sample loss of the micro-batches whose forward
        the last stage ran in it; the stream drains with its last mini-batch."""
        self._step += 1
        if self._step == self.schedule.stream.minibatches:
            self._end()
        st = piece.state
        return sum((loss / st.weights[n] * st.sizes[n]
                    for n, loss in (st.item_loss or {}).items()), 0.0)

    def _begin(self) -> None:
        self.transport.window = self.program.window
        assert self.optimizer is not None
        self.weights.begin(self.optimizer, keep_initial=0 in self.program.used)
        if 0 in self.weights.versions:
            self.compute.memory.exclude(self.weights.tensors(0))
        self.compute.defer_weights(self._defers())
        self._state = StepState(sizes={}, weights={}, inputs={}, labels={})
        self._pos = 0

    def _end(self) -> None:
        """The stream drained: nothing in flight, every version but the module's dropped."""
        assert self._pos == len(self.program.actions), "the last step runs the rest"
        assert not self._pending, "every step of the stream met its U"
        self._scale.clear()
        self.compute.defer_weights(False)
        self.weights.end()
        self.transport.window = 0
        self._state = None
        self._step = 0

    def _defers(self) -> bool:
        """Whether the fused layers' weight gradients wait for the `U` as rows, whose GEMMs
        then write the step (`optim.step_into`): stepped out of place, on a stage no
        replica sums."""
        return self.weights.out_of_place and self.reduce is None

    # -- the weights' actions ----------------------------------------------------------------
    def select(self, version: int) -> None:
        """`V`: the next forwards and backwards run on `version`."""
        self.weights.current = version

    def after_backward(self, position: int, microbatch: int) -> None:
        """The backward at `position` added its gradient into the current version: take a
        step's gradient out when it completes it, drop the versions no later action uses."""
        self.weights.backward_done(microbatch)
        update = self.program.takes.get(position)
        grad = self.weights.take_gradient(update, self.compute.take_rows(update.items)) \
            if update is not None else None
        for v in self.program.drops.get(position, []):  # before the U makes a new one
            self.weights.drop(v)
        if update is None or grad is None:
            return
        scale = self._scale.pop(update.items[0], 1.0)
        for n in update.items[1:]:
            assert abs(self._scale.pop(n, 1.0) - scale) < 1e-12, "one scale per replica step"
        if scale != 1.0:
            grad.scale(scale)
        self._pending.append((update, grad))

    def all_reduce(self) -> None:
        """`AR`: sum the oldest pending step's gradient over the stage's replicas."""
        assert self.reduce is not None and self._pending, "an AR without a step"
        update, grad = self._pending[0]
        self.weights.load_gradient(grad.dense())
        self.reduce.reduce_gradients()
        self.reduce.finish()
        self._pending[0] = (update, StepGradient(self.weights.module_gradient(), {}))

    def update(self, version: int) -> None:
        """`U`: step the optimiser with the oldest pending gradient, making `version`."""
        assert self.optimizer is not None
        update, grad = self._pending.popleft()
        assert update.version == version, f"U{version} meets the gradient of step {update}"
        self.weights.update(update, grad, self.optimizer, keep=version in self.program.used)
        if version in self.weights.versions:
            self.compute.memory.exclude(self.weights.tensors(version))

    def summary(self) -> dict[str, Any]:
        return {"buffer_window": self.program.window,
                "peak_weight_version_bytes": self.weights.peak_bytes,
                "weight_steps_out_of_place": self.weights.out_of_place,
                "weight_steps_in_place": self.weights.in_place_steps,
                "weight_steps_from_rows": self.weights.row_steps,
                "weight_copy_bytes": self.weights.copied_bytes}


def stream_optimizer(stream: StreamState, factory: OptimizerFactory,
                     params: Iterator[nn.Parameter], delay_rule: str,
                     schedule: str) -> tuple[torch.optim.Optimizer, str | None]:
    """The optimiser `factory` makes over `params`, bound to `stream` and run with the
    momentum the delay rule gives the stage's gradient delay (`optim.delay`); and the
    rule's line on the stages of `schedule` (None: nothing to say)."""
    optimizer = factory(params)
    delays = stream.delays()
    line = delay_line(float(optimizer.param_groups[0].get("momentum", 0.0)), delays, delay_rule,
                      f"on stages 0-{len(delays) - 1} ({schedule})")
    apply_delay_rule(optimizer, delays[stream.stage], delay_rule)
    stream.bind(optimizer)
    return optimizer, line
