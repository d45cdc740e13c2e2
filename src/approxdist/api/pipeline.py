"""`approxdist.Pipeline`: pipeline parallelism for a user's own model, data, loss and loop.

In the spirit of `approxdist.DataParallel` and of torch.distributed.pipelining's stage +
schedule: every rank builds the same `nn.Sequential` (or list of blocks) from the same
seed and wraps it; each rank keeps its stage's blocks and runs them on the pipeline
engine (`pipeline.runtime`: partition, transport through the link layer, executor), so
every schedule, wire format per direction, channel, emulated link, recomputation and
tracing apply. The user's loop calls `step` once per mini-batch:

    dist.init_process_group("gloo")
    pipe = approxdist.Pipeline(model, sample=x0, schedule="1f1b", microbatches=4,
                               fwd_codec="bf16", loss_fn=F.cross_entropy)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.05)
    for x, y in batches:                 # every rank walks the same mini-batches
        loss = pipe.step(x, y)           # the mean loss on the last stage, None elsewhere
        opt.step(); opt.zero_grad()

Stage 0 reads the inputs, the last stage the targets (the others may pass None). An
asynchronous schedule (pipedream, pipedream-vsync, 2bw) steps the optimiser itself: give
`optimizer=` and `stream=K`, and its momentum is lowered for the stage's gradient delay
(`delay_rule=`). `replicas=(2, 1)` replicates stages (hybrid, seed 002: the replicas sum
their gradients through `DataParallel`, so `step` leaves the mini-batch's gradient on
every replica), `placement=` puts the stages on any ranks. These options, `dynamic_shapes=`,
`recorder=` and the saved state are in docs/api.md; `pipeline_args` checks the arguments.

`approxdist train --parallel pipeline|hybrid` runs this class: its engine
(`train/engines/pipeline.py`) builds it with `Pipeline.from_config` on the mesh's groups
and steps it with `train_step`, the step `step` is made of.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.api.pipeline_args import (
    check_async_replicas,
    check_schedule,
    dp_section,
    pipeline_section,
    replica_counts,
    wires,
)
from approxdist.config.dp import DPConfig
from approxdist.config.pipeline import PipelineConfig
from approxdist.config.wire import WireConfig
from approxdist.data_parallel.checks import context_of
from approxdist.data_parallel.replicas import ReplicaReducer
from approxdist.errors import ConfigError
from approxdist.hybrid.runtime import build_hybrid_runtime, mean_loss
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group
from approxdist.optim.delay import check_rule
from approxdist.pipeline.executor import StepResult
from approxdist.pipeline.runtime import PipelineRuntime, build_runtime
from approxdist.pipeline.runtime_state import load_stage_state, stage_state
from approxdist.pipeline.split_check import check_splittable
from approxdist.pipeline.stage import LossFn
from approxdist.pipeline.stream_state import OptimizerFactory, stream_optimizer
from approxdist.topology import Mesh
from approxdist.topology.groups import MeshGroups, make_groups
from approxdist.trace.recorder import NULL_RECORDER, Recorder


class Pipeline:
    """This rank's stage of `model`, run by the pipeline engine one mini-batch per `step`."""

    def __init__(self, model: nn.Sequential | Sequence[nn.Module], *, sample: torch.Tensor,
                 stages: int | None = None, split: str | Sequence[int] = "",
                 balance: str = "", schedule: str = "1f1b", microbatches: int = 4,
                 fwd_codec: str = "fp32", bwd_codec: str = "fp32", fwd_channel: str = "none",
                 bwd_channel: str = "none", link: str = "", recompute: bool = False,
                 loss_fn: LossFn = F.cross_entropy, group: Group | None = None,
                 optimizer: OptimizerFactory | None = None, stream: int = 0,
                 dynamic_shapes: bool = False, seed: int = 0,
                 replicas: int | Sequence[int] = 1, grad_codec: str = "fp32",
                 algorithm: str = "auto", calibration: str = "",
                 placement: Sequence[int] | None = None, comm_threads: str = "inline",
                 delay_rule: str = "auto", recorder: Recorder | None = None) -> None:
        blocks = model if isinstance(model, nn.Sequential) else nn.Sequential(*model)
        ctx = context_of(blocks)
        if not ctx.distributed:
            raise ConfigError("approxdist.Pipeline needs torch.distributed: call "
                              "dist.init_process_group(...) on every rank first (e.g. under "
                              "torchrun), one rank per stage")
        asynchronous = check_schedule(schedule, optimizer, stream)
        check_rule(delay_rule, "delay_rule")
        counts = replica_counts(replicas, stages, ctx.world_size)
        if group is not None and (counts or placement):
            raise ConfigError("group= runs the pipeline on those ranks in order; replicas= and "
                              "placement= place it on the whole world: pass one of the two")
        pcfg = pipeline_section(
            stages or (len(counts) if counts else group.size if group else ctx.world_size),
            split, balance=balance, microbatches=microbatches, schedule=schedule,
            recompute=recompute, dynamic_shapes=dynamic_shapes, replicas=counts,
            placement=tuple(placement or ()), comm_threads=comm_threads)
        check_splittable(pcfg, blocks, sample)  # every rank alike, before any transfer
        dp, grad = dp_section(bool(counts), grad_codec, algorithm, calibration)
        wire = wires(grad, fwd_codec, bwd_codec, fwd_channel, bwd_channel)
        if counts and asynchronous:
            check_async_replicas(schedule, counts, microbatches)
        groups = None
        if group is None and (counts or placement):
            mesh = Mesh.stages(pcfg.stages, counts or 1, placement)
            groups = make_groups(mesh, ctx, lanes={("dp",): dp.threads + 2})
        self._assemble(blocks, ctx, sample, pcfg, dp, wire, groups=groups, group=group, link=link,
                       seed=seed, loss_fn=loss_fn, optimizer=optimizer, stream=stream,
                       recorder=recorder or NULL_RECORDER, delay_rule=delay_rule)

    @classmethod
    def from_config(cls, model: nn.Sequential, *, sample: torch.Tensor, pipeline: PipelineConfig,
                    dp: DPConfig, wire: WireConfig, groups: MeshGroups, link: str = "",
                    seed: int = 0, loss_fn: LossFn = F.cross_entropy,
                    optimizer: OptimizerFactory | None = None, stream: int = 0,
                    recorder: Recorder = NULL_RECORDER, delay_rule: str = "auto") -> Pipeline:
        """The pipeline a checked config describes on the mesh's `groups` (the trainer's
        engine builds it so; `approxdist.train.check.check_parts` checked the sections)."""
        pipe = cls.__new__(cls)
        pipe._assemble(model, context_of(model), sample, pipeline, dp, wire, groups=groups,
                       group=None, link=link, seed=seed, loss_fn=loss_fn, optimizer=optimizer,
                       stream=stream, recorder=recorder, delay_rule=delay_rule)
        return pipe

    def _assemble(self, blocks: nn.Sequential, ctx: DistContext, sample: torch.Tensor,
                  pcfg: PipelineConfig, dp: DPConfig, wire: WireConfig, *,
                  groups: MeshGroups | None, group: Group | None, link: str, seed: int,
                  loss_fn: LossFn,
                  optimizer: OptimizerFactory | None, stream: int, recorder: Recorder,
                  delay_rule: str) -> None:
        """This rank's stage (collective over the pipeline): replicated on `groups` when a
        stage has several replicas, else on `groups`' pipeline, `group` or the world."""
        self.recorder, self.wire = recorder, wire
        self.schedule, self.microbatches = pcfg.schedule, pcfg.microbatches
        #: the stage's replica group (hybrid), for the loss of a replicated last stage
        self.replica_group: Group | None = None
        if groups is not None and max(groups.mesh.replicas) > 1:
            self.runtime: PipelineRuntime = build_hybrid_runtime(
                pcfg, dp, wire, blocks, ctx, groups, sample, link=link, seed=seed, rec=recorder,
                loss_fn=loss_fn, minibatches=max(stream, 1))
            self.replica_group = groups.replicas
        else:
            row = groups.pipeline if groups is not None else group
            self.runtime = build_runtime(pcfg, blocks, ctx, sample, group=row, link_spec=link,
                                         seed=seed, rec=recorder, loss_fn=loss_fn,
                                         minibatches=max(stream, 1), fwd=wire.fwd,
                                         bwd=wire.bwd)
        self.module: nn.Sequential = self.runtime.module
        self.optimizer: torch.optim.Optimizer | None = None
        #: what the delay rule did to the stages' momentum, or why it would (None: nothing)
        self.delay_line: str | None = None
        state = self.runtime.executor.stream  # the schedule's U actions step an optimiser
        if state is not None:
            assert optimizer is not None
            self.optimizer, self.delay_line = stream_optimizer(
                state, optimizer, self.module.parameters(), delay_rule, pcfg.schedule)

    # -- where this rank is --------------------------------------------------------------
    @property
    def stage(self) -> int:
        return self.runtime.stage

    @property
    def is_first(self) -> bool:
        """Whether this rank runs the first stage (it feeds the inputs)."""
        return self.runtime.executor.is_first

    @property
    def is_last(self) -> bool:
        """Whether this rank runs the last stage (ZB-V: rank 0, with the first)."""
        return self.runtime.executor.is_last

    @property
    def steps_optimizer(self) -> bool:
        """Whether the pipeline steps its optimiser itself (an asynchronous schedule)."""
        return self.optimizer is not None

    @property
    def reducer(self) -> ReplicaReducer | None:
        """The replicas' gradient reducer of a replicated stage (None: a stage alone)."""
        return self.runtime.grad_sync

    def set_grad_codec(self, codec: str, rules: tuple[str, ...] = ()) -> None:
        """Send the replicas' next gradients in `codec` (`rules`: per parameter), their
        residuals kept (AdaPrec); a stage alone on its rank sends none."""
        if self.reducer is not None:
            self.reducer.set_codecs(rules, codec)

    def parameters(self) -> Iterator[nn.Parameter]:
        """This rank's stage's parameters (for the user's optimiser)."""
        return self.module.parameters()

    # -- steps -----------------------------------------------------------------------------
    def train_step(self, inputs: Any, targets: torch.Tensor | None,
                   batch_size: int | None = None) -> StepResult:
        """Forward and backward of one mini-batch on this rank, as the executor reports it:
        the weighted loss and hits of this rank's micro-batches (on the last stage), the
        time split and the peak activation bytes."""
        size = self._size(inputs, targets, batch_size)
        return self.runtime.executor.train_step(inputs if self.is_first else None,
                                                targets if self.is_last else None, size)

    def step(self, inputs: Any, targets: torch.Tensor | None,
             batch_size: int | None = None) -> float | None:
        """Forward and backward of one mini-batch; gradients accumulate into the stage's
        `.grad` (an asynchronous schedule also steps its optimiser). Returns the mean loss
        over the samples the last stage finished, None on other stages. `batch_size` is
        needed only on ranks that pass neither inputs nor targets."""
        res = self.train_step(inputs, targets, batch_size)
        if not self.is_last:
            return None
        return mean_loss(res, self.replica_group, streamed=self.steps_optimizer)

    @torch.no_grad()
    def eval_step(self, inputs: Any, targets: torch.Tensor | None,
                  batch_size: int | None = None) -> tuple[float, int, int]:
        """Forward-only pipeline over one batch in the module's current mode: (summed loss,
        correct predictions, samples this rank ran); zeros but the samples off the last
        stage."""
        size = self._size(inputs, targets, batch_size)
        compute = self.runtime.compute
        compute.reset_step()
        ran = self.runtime.executor.eval_batch(inputs if self.is_first else None,
                                               targets if self.is_last else None, size)
        if not self.is_last:
            return 0.0, 0, ran
        return float(compute.loss_sum), int(compute.correct), ran

    @torch.no_grad()
    def score_step(self, inputs: Any, targets: torch.Tensor | None,
                   batch_size: int | None = None) -> tuple[float, int, int]:
        """`eval_step`, scored by the probability of the true class (a `loss_fn` with a
        `soft_sum`, as `train.task.Task`): (its sum, correct predictions, samples this rank
        ran); zeros but the samples off the last stage (AdaPrec's signal)."""
        _, correct, ran = self.eval_step(inputs, targets, batch_size)
        return float(self.runtime.compute.soft_sum), correct, ran

    @torch.no_grad()
    def evaluate(self, inputs: Any, targets: torch.Tensor | None,
                 batch_size: int | None = None) -> tuple[float, int] | None:
        """Forward-only pipeline over one batch in eval mode: (summed loss, correct
        predictions) on the last stage, None elsewhere (hits count `output.argmax(1) ==
        targets`)."""
        self.module.eval()
        try:
            loss, correct, _ = self.eval_step(inputs, targets, batch_size)
        finally:
            self.module.train()
        return (loss, correct) if self.is_last else None

    def _size(self, inputs: Any, targets: torch.Tensor | None, batch_size: int | None) -> int:
        if batch_size is not None:
            return batch_size
        for t in (inputs if isinstance(inputs, torch.Tensor) else None, targets):
            if t is not None:
                return int(t.shape[0])
        raise ConfigError(f"stage {self.stage} got neither inputs nor targets; pass "
                          f"batch_size= (the mini-batch's sample count) on the middle stages")

    # -- between epochs, state, figures ------------------------------------------------------
    def sync_buffers(self) -> None:
        """A replicated stage's replicas average their batch-norm statistics."""
        if self.reducer is not None:
            self.reducer.sync_buffers()

    def link_bytes(self) -> dict[str, int]:
        """Bytes this rank sent so far per directed link `"i->j"` (activations, gradients
        and the replicas' all-reduce)."""
        link, sync = self.runtime.link, self.reducer
        out = {f"{link.me}->{peer}": n for peer, n in sorted(link.stats.sent.items())}
        for key, n in (sync.link_bytes() if sync is not None else {}).items():
            out[key] = out.get(key, 0) + n
        return out

    def state_dict(self) -> dict[str, Any]:
        """The stage's module, the optimiser the pipeline steps (asynchronous schedules) and
        the replicas' reducer state (a collective over the stage's replicas)."""
        return stage_state(self.runtime, self.optimizer, self.schedule)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_stage_state(self.runtime, self.optimizer, state)

    def summary(self) -> dict[str, Any]:
        """The partition, replicas and schedule; an asynchronous one's weight versions."""
        rt = self.runtime
        out = {"stages": rt.partition.num_stages, "partition": rt.partition.describe(),
               "replicas": list(rt.transport.dealing.replicas), "schedule": self.schedule,
               "microbatches": self.microbatches, "fwd_codec": self.wire.fwd.codec,
               "bwd_codec": self.wire.bwd.codec}
        if rt.executor.stream is not None:
            out.update(rt.executor.stream.summary())
        return out

    def close(self) -> None:
        """Release the link's threads (call once, after training)."""
        self.runtime.close()
