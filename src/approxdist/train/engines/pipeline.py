"""Pipeline training: each rank runs one stage of the model on its pipeline row (seeds 000, 002).

Every rank of a row draws the same mini-batches (the row is one data-parallel shard);
stage 0 feeds the inputs, the last stage the labels, the others only need the batch
size. Each mini-batch runs as M micro-batches through the schedule
(`pipeline.executor`), then every stage takes one optimiser step on its own parameters.
Evaluation is a forward-only pipeline; loss and hits exist on the last stage. Which
ranks hold the stages is the topology's: the row is a `Group` in stage order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from approxdist.config.schema import Config
from approxdist.data import TensorDataset
from approxdist.launch.context import DistContext
from approxdist.models import build_model
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.runtime import PipelineRuntime, build_runtime, check_run
from approxdist.topology.groups import TopologyGroups
from approxdist.trace import OPTIMIZER, Recorder
from approxdist.train.engine import ENGINES, StepOutcome
from approxdist.train.optim import make_sgd


class PipelineEngine:
    """This rank's stage (`runtime`) and its optimiser."""

    def __init__(self, cfg: Config, runtime: PipelineRuntime, optimizer: torch.optim.Optimizer,
                 groups: TopologyGroups, rec: Recorder) -> None:
        self.cfg, self.runtime, self.optimizer, self.rec = cfg, runtime, optimizer, rec
        self.module: nn.Module = runtime.module
        self.optimizers = [optimizer]
        self.feeds_inputs = runtime.transport.is_first
        self.feeds_labels = runtime.transport.is_last
        self.shard = (groups.place.replica, groups.topology.replicas[0])

    def train_step(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> StepOutcome:
        res = self.runtime.executor.train_step(x, y, batch_size)
        with self.rec.span(OPTIMIZER):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        if not self.feeds_labels:  # loss and hits exist on the last stage only
            return StepOutcome(0.0, 0, 0, res.times, res.peak_activation_bytes)
        return StepOutcome(res.loss * res.samples, res.correct, res.samples, res.times,
                           res.peak_activation_bytes)

    @torch.no_grad()
    def eval_batch(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> tuple[float, int]:
        compute = self.runtime.compute
        compute.reset_step()
        self.runtime.executor.eval_batch(x, y, batch_size)
        return float(compute.loss_sum), int(compute.correct)

    def end_epoch(self) -> None:
        """Stages hold disjoint parameters: nothing to average."""

    def link_bytes(self) -> dict[str, int]:
        link = self.runtime.link
        return {f"{link.me}->{peer}": n for peer, n in sorted(link.stats.sent.items())}

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                "boundaries": list(self.runtime.partition.boundaries)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        cut = tuple(state["boundaries"])
        if cut != self.runtime.partition.boundaries:
            raise PipelineError(f"checkpoint of stage {self.runtime.stage} was cut at {cut}, "
                                f"this run at {self.runtime.partition.boundaries}; resume with "
                                f"the original --split")
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def start(self) -> None:
        """Every rank built the same model from the same seed: nothing to broadcast."""

    def summary(self) -> dict[str, Any]:
        p, rt = self.cfg.pipeline, self.runtime
        return {"stages": rt.partition.num_stages, "partition": rt.partition.describe(),
                "schedule": p.schedule, "microbatches": p.microbatches,
                "fwd_codec": p.fwd_codec, "bwd_codec": p.bwd_codec, "recompute": p.recompute,
                "fuse_accumulation": p.fuse_accumulation}

    def close(self) -> None:
        self.runtime.close()


def build_pipeline(cfg: Config, ctx: DistContext, groups: TopologyGroups, data: TensorDataset,
                   rec: Recorder) -> PipelineEngine:
    """Every rank builds the whole model from the same seed and keeps its stage's blocks."""
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(ctx.device)
    check_run(cfg.pipeline, len(model), cfg.data.batch_size)
    micro = max(1, cfg.data.batch_size // cfg.pipeline.microbatches)
    row = groups.pipeline if groups.pipeline is not None else groups.world
    runtime = build_runtime(cfg.pipeline, model, ctx, data.train_x[:micro].to(ctx.device),
                            group=row, link_spec=cfg.comm.link, seed=cfg.train.seed, rec=rec)
    return PipelineEngine(cfg, runtime, make_sgd(runtime.module, cfg.optim), groups, rec)


ENGINES.add("pipeline", build_pipeline)
