"""Pipeline and hybrid training: each rank runs one stage, replicated or not (seeds 000, 002).

Every rank draws the whole mini-batch; stage 0's ranks feed the inputs of their
micro-batches, the last stage's ranks the labels, the others only need the batch size.
Each mini-batch runs as M micro-batches through the schedule (`pipeline.executor`); a
replicated stage (`--parallel hybrid`) runs the micro-batches dealt to it round robin
and sums its gradients over its replicas (`hybrid`), then every stage takes one
optimiser step on its own parameters. An asynchronous schedule (pipedream, 2bw) runs as a
stream over each epoch's mini-batches (`StreamEngine`, `pipeline.stream`), replicated or
not: the optimiser steps inside it (a replicated stage's replicas in lockstep on their
summed gradient), and each step record says which weight versions produced its loss.
Evaluation is a forward-only pipeline; loss and hits exist on the last stage. Which
ranks hold the stages is the topology's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from approxdist.config.schema import Config
from approxdist.data import ShardedBatches, TensorDataset
from approxdist.data_parallel.engine import DataParallel
from approxdist.hybrid import build_hybrid_runtime
from approxdist.launch.context import DistContext
from approxdist.models import build_model
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.runtime import PipelineRuntime, build_runtime, check_run
from approxdist.pipeline.schedule.stream_cut import loss_versions
from approxdist.pipeline.stream import StreamExecutor
from approxdist.topology.groups import MeshGroups
from approxdist.trace import OPTIMIZER, Recorder
from approxdist.train.engine import StepOutcome
from approxdist.train.optim import make_sgd
from approxdist.train.task import Task, task_named


class PipelineEngine:
    """This rank's stage (`runtime`, with its replica all-reduce if replicated) and optimiser."""

    def __init__(self, cfg: Config, runtime: PipelineRuntime, optimizer: torch.optim.Optimizer,
                 rec: Recorder) -> None:
        self.cfg, self.runtime, self.optimizer, self.rec = cfg, runtime, optimizer, rec
        self.module: nn.Module = runtime.module
        self.optimizers = [optimizer]
        self.feeds_inputs = runtime.transport.is_first
        self.feeds_labels = runtime.transport.is_last
        self.shard = (0, 1)  # the executor picks this rank's micro-batches of the mini-batch
        sync = runtime.grad_sync
        self.sync: DataParallel | None = sync if isinstance(sync, DataParallel) else None

    def train_step(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> StepOutcome:
        res = self.runtime.executor.train_step(x, y, batch_size)
        with self.rec.span(OPTIMIZER):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        if not self.feeds_labels:  # loss and hits exist on the last stage only
            return StepOutcome(0.0, 0, 0, res.times, res.peak_activation_bytes)
        assert y is not None
        k = Task.per_sample(y)  # the executor counts samples, scores count predictions
        # res.loss weighs each micro-batch by its share of the mini-batch
        return StepOutcome(res.loss * batch_size * k, res.correct, res.samples * k, res.times,
                           res.peak_activation_bytes)

    @torch.no_grad()
    def eval_batch(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> tuple[float, int, int]:
        compute = self.runtime.compute
        compute.reset_step()
        ran = self.runtime.executor.eval_batch(x, y, batch_size)
        if not self.feeds_labels:
            return 0.0, 0, 0
        assert y is not None
        k = Task.per_sample(y)
        return float(compute.loss_sum) * k, int(compute.correct), ran * k

    def end_epoch(self) -> None:
        """Replicas of a stage average their batch-norm statistics; stages share nothing."""
        if self.sync is not None:
            self.sync.sync_buffers()

    def link_bytes(self) -> dict[str, int]:
        link = self.runtime.link
        out = {f"{link.me}->{peer}": n for peer, n in sorted(link.stats.sent.items())}
        for key, n in (self.sync.link_bytes() if self.sync is not None else {}).items():
            out[key] = out.get(key, 0) + n
        return out

    def state_dict(self) -> dict[str, Any]:
        """Collective over the stage's replicas when replicated (residuals are gathered)."""
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                "boundaries": list(self.runtime.partition.boundaries),
                "dp": self.sync.checkpoint_state() if self.sync is not None else {}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        cut = tuple(state["boundaries"])
        if cut != self.runtime.partition.boundaries:
            raise PipelineError(f"checkpoint of stage {self.runtime.stage} was cut at {cut}, "
                                f"this run at {self.runtime.partition.boundaries}; resume with "
                                f"the original --split")
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.sync is not None:
            self.sync.load_checkpoint_state(state.get("dp", {}))

    def start(self) -> None:
        """Every rank built the same model from the same seed: nothing to broadcast."""

    def summary(self) -> dict[str, Any]:
        p, rt = self.cfg.pipeline, self.runtime
        return {"stages": rt.partition.num_stages, "partition": rt.partition.describe(),
                "replicas": list(rt.transport.dealing.replicas),
                "schedule": p.schedule, "microbatches": p.microbatches,
                "fwd_codec": p.fwd_codec, "bwd_codec": p.bwd_codec, "recompute": p.recompute,
                "fuse_accumulation": p.fuse_accumulation}

    def close(self) -> None:
        self.runtime.close()


class StreamEngine(PipelineEngine):
    """A stage running an asynchronous schedule (`pipeline.stream`): the executor steps the
    optimiser where the schedule updates, the stream drains at the end of each epoch."""

    def __init__(self, cfg: Config, runtime: PipelineRuntime, optimizer: torch.optim.Optimizer,
                 rec: Recorder) -> None:
        super().__init__(cfg, runtime, optimizer, rec)
        assert isinstance(runtime.executor, StreamExecutor)
        self.stream: StreamExecutor = runtime.executor
        self.stream.bind(optimizer)
        self.versions = loss_versions(self.stream.schedule, self.stream.all_cuts)

    def train_step(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> StepOutcome:
        b = self.stream.next_step
        res = self.stream.train_step(x, y, batch_size)
        record = {"weight_versions": [list(v) for v in self.versions[b]]}
        version_bytes = self.stream.weights.peak_bytes
        if not self.feeds_labels:
            return StepOutcome(0.0, 0, 0, res.times, res.peak_activation_bytes, version_bytes,
                               record)
        assert y is not None
        k = Task.per_sample(y)
        return StepOutcome(res.loss * k, res.correct, res.samples * k, res.times,
                           res.peak_activation_bytes, version_bytes, record)

    def state_dict(self) -> dict[str, Any]:
        if self.stream.in_stream:
            raise PipelineError(f"stage {self.runtime.stage} is inside a stream of "
                                f"{self.cfg.pipeline.schedule} with micro-batches in flight; "
                                f"checkpoints are taken at epoch ends, where the stream drained")
        return super().state_dict()

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), **self.stream.summary()}


def build_pipeline(cfg: Config, ctx: DistContext, groups: MeshGroups, data: TensorDataset,
                   rec: Recorder) -> PipelineEngine:
    """Every rank builds the whole model from the same seed and keeps its stage's blocks."""
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(ctx.device)
    check_run(cfg.pipeline, len(model), cfg.data.batch_size)
    micro = max(1, cfg.data.batch_size // cfg.pipeline.microbatches)
    sample = data.train_x[:micro].to(ctx.device)
    task = task_named(data.task)
    steps = ShardedBatches(data, cfg.data.batch_size, 0, 1, cfg.train.seed).steps_per_epoch
    if max(groups.mesh.replicas) > 1:
        runtime = build_hybrid_runtime(cfg, model, ctx, groups, sample, rec, loss_fn=task,
                                       minibatches=steps)
    else:
        row = groups.pipeline if groups.pipeline is not None else groups.world
        runtime = build_runtime(cfg.pipeline, model, ctx, sample, group=row,
                                link_spec=cfg.comm.link, seed=cfg.train.seed, minibatches=steps,
                                rec=rec, loss_fn=task)
    engine = StreamEngine if isinstance(runtime.executor, StreamExecutor) else PipelineEngine
    return engine(cfg, runtime, make_sgd(runtime.module, cfg.optim), rec)
