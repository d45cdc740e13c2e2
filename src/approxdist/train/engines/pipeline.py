"""Pipeline and hybrid training: each rank runs one stage, replicated or not (seeds 000, 002).

A thin adapter over the public `approxdist.Pipeline` (the class a user's own loop runs),
built on the mesh's groups with `Pipeline.from_config`. Every rank draws the whole
mini-batch; stage 0's ranks feed the inputs of their micro-batches, the last stage's
ranks the labels, the others only need the batch size. A flushed schedule (gpipe, 1f1b)
runs each mini-batch as M micro-batches (`train_step`), then every stage takes one
optimiser step on its own parameters (a replicated stage after summing its gradients over
its replicas). An asynchronous schedule (pipedream, 2bw) runs as a stream over each
epoch's mini-batches: the pipeline steps the optimiser inside it (momentum lowered for the
stage's gradient delay by the delay rule, which the run names in one line before it
starts), and each step record says which weight versions produced its loss. Evaluation is
a forward-only pipeline; loss and hits exist on the last stage.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from approxdist.api.pipeline import Pipeline
from approxdist.comm.update_error import Sums
from approxdist.config.schema import Config
from approxdist.data import ShardedBatches, TensorDataset
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.runtime import check_run
from approxdist.pipeline.schedule import async_schedule_names
from approxdist.pipeline.schedule.stream_cut import loss_versions, step_cuts
from approxdist.topology.groups import MeshGroups
from approxdist.trace import OPTIMIZER, Recorder
from approxdist.train import log
from approxdist.train.engine import StepOutcome, load_trained, seeded_model, trained_state
from approxdist.train.engines.tp_split import TPSplit, split_model
from approxdist.train.optim import make_sgd, sgd_over
from approxdist.train.task import Task, task_named


class PipelineEngine:
    """This rank's stage of a `Pipeline`, and the optimiser over it."""

    def __init__(self, cfg: Config, pipe: Pipeline, optimizer: torch.optim.Optimizer,
                 rec: Recorder, split: TPSplit | None = None) -> None:
        self.cfg, self.pipe, self.optimizer, self.rec = cfg, pipe, optimizer, rec
        self.split = split  # the stage's layers split over its `tp` ranks
        self.module: nn.Module = pipe.module
        self.optimizers = [optimizer]
        self.feeds_inputs, self.feeds_labels = pipe.is_first, pipe.is_last
        self.codec = cfg.wire.grad.codec  # in force on the replicas' gradient wire
        self.shard = (0, 1)  # the executor picks this rank's micro-batches of the mini-batch
        self.stream = stream = pipe.runtime.executor.stream  # an asynchronous schedule's
        self.versions = loss_versions(stream.schedule, step_cuts(stream.schedule)) \
            if stream is not None else []

    def train_step(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> StepOutcome:
        record: dict[str, Any] = {}
        if self.stream is not None:
            record = {"weight_versions": [list(v) for v in self.versions[self.stream.next_step]]}
        res = self.pipe.train_step(x, y, batch_size)
        if not self.pipe.steps_optimizer:
            with self.rec.span(OPTIMIZER):
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        versions = self.stream.weights.peak_bytes if self.stream is not None else 0
        if not self.feeds_labels:  # loss and hits exist on the last stage only
            return StepOutcome(0.0, 0, 0, res.times, res.peak_activation_bytes, versions, record)
        assert y is not None
        k = Task.per_sample(y)  # the executor counts samples, scores count predictions
        # a flushed step weighs each micro-batch by its share of the mini-batch; a stream's
        # loss is the sum over the micro-batches the last stage finished
        loss_sum = res.loss * k if self.stream is not None else res.loss * batch_size * k
        return StepOutcome(loss_sum, res.correct, res.samples * k, res.times,
                           res.peak_activation_bytes, versions, record)

    def eval_batch(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> tuple[float, int, int]:
        loss, correct, ran = self.pipe.eval_step(x, y, batch_size)
        if not self.feeds_labels:
            return 0.0, 0, 0
        assert y is not None
        k = Task.per_sample(y)
        return loss * k, correct, ran * k

    def score_batch(self, x: torch.Tensor | None, y: torch.Tensor | None,
                    batch_size: int) -> tuple[float, int, int]:
        """(the true class's probability summed, correct, predictions) of one batch, on the
        last stage (AdaPrec's signal); zeros elsewhere."""
        soft, correct, ran = self.pipe.score_step(x, y, batch_size)
        if not self.feeds_labels:
            return 0.0, 0, 0
        assert y is not None
        return soft, correct, ran * Task.per_sample(y)

    def local_state(self) -> dict[str, Any]:
        """This stage's state without collectives (`train/snapshot.py`): module,
        optimiser, the replicas' error-feedback residuals; a flushed schedule's only (an
        asynchronous one holds micro-batches in flight at every step)."""
        if self.stream is not None:
            raise PipelineError(f"{self.cfg.pipeline.schedule} streams mini-batches across "
                                f"steps: its state at a step is not this rank's alone; "
                                f"AdaPrec needs a flushed schedule (gpipe, 1f1b)")
        sync = self.pipe.reducer
        return {**trained_state(self.module, self.optimizer,
                                sync.local_state() if sync is not None else {}),
                **(self.split.local_state() if self.split else {})}

    def load_local_state(self, state: Mapping[str, Any]) -> None:
        reducer = load_trained(self.module, self.optimizer, state)
        if self.pipe.reducer is not None:
            self.pipe.reducer.load_local_state(reducer)
        if self.split:
            self.split.load_state_dict(state, local=True)

    def set_wire(self, name: str, codec: str, rules: tuple[str, ...] = ()) -> None:
        """Switch the replicas' gradient wire (AdaPrec), its residuals kept."""
        if name != "grad":
            raise ConfigError(f"wire {name!r} of a pipeline cannot be switched during "
                              f"training; AdaPrec chooses the replicas' gradient wire (grad)")
        self.pipe.set_grad_codec(codec, rules)
        self.codec = codec

    def update_error(self, measure: bool) -> Sums:
        """The replicas' gradient codec's error on this stage's gradients, its parameters
        named `stage<k>.<name>` (the stages' own names may repeat); nothing on a stage alone."""
        sync = self.pipe.reducer
        sums = sync.update_error(measure) if sync is not None else {}
        return {f"stage{self.pipe.stage}.{name}": v for name, v in sums.items()}

    def end_epoch(self) -> None:
        """Replicas of a stage average their batch-norm statistics; stages share nothing."""
        self.pipe.sync_buffers()

    def link_bytes(self) -> dict[str, int]:
        out = self.pipe.link_bytes()
        return self.split.link_bytes(out) if self.split else out

    def state_dict(self) -> dict[str, Any]:
        """Collective over the stage's replicas when replicated (residuals are gathered)."""
        return {**self.pipe.state_dict(), "optimizer": self.optimizer.state_dict(),
                **(self.split.state_dict() if self.split else {})}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.pipe.load_state_dict(state)
        self.optimizer.load_state_dict(state["optimizer"])
        if self.split:
            self.split.load_state_dict(state)

    def start(self) -> None:
        """Every rank built the same model from the same seed: nothing to broadcast."""

    def wires(self) -> dict[str, str]:
        """The wires this stage sends on and their codecs."""
        w = self.cfg.wire
        return {"fwd": w.fwd.codec, "bwd": w.bwd.codec,
                **({"grad": self.codec} if self.pipe.reducer is not None else {}),
                **(self.split.wires() if self.split else {})}

    def summary(self) -> dict[str, Any]:
        p = self.cfg.pipeline
        return {**self.pipe.summary(), "recompute": p.recompute,
                "fuse_accumulation": p.fuse_accumulation,
                **(self.split.summary() if self.split else {})}

    def close(self) -> None:
        self.pipe.close()
        if self.split:
            self.split.close()


def build_pipeline(cfg: Config, ctx: DistContext, groups: MeshGroups, data: TensorDataset,
                   rec: Recorder) -> PipelineEngine:
    """Every rank builds the whole model from the same seed and keeps its stage's blocks
    (split over the stage's `tp` ranks first, when the mesh has them: each `tp` lane is
    a pipeline of its own over the same micro-batches)."""
    model = seeded_model(cfg, data, ctx)
    split = split_model(cfg, model, groups["tp"], groups.replicas, rec) \
        if groups["tp"].size > 1 else None
    check_run(cfg.pipeline, len(model), cfg.data.batch_size)
    micro = max(1, cfg.data.batch_size // cfg.pipeline.microbatches)
    steps = ShardedBatches(data, cfg.data.batch_size, 0, 1, cfg.train.seed).steps_per_epoch
    optimizers: list[torch.optim.Optimizer] = []

    def sgd(params: Iterator[nn.Parameter]) -> torch.optim.Optimizer:  # the stream's, kept
        optimizers.append(sgd_over(params, cfg.optim))
        return optimizers[-1]

    asynchronous = cfg.pipeline.schedule in async_schedule_names()
    pipe = Pipeline.from_config(model, sample=data.train_x[:micro].to(ctx.device),
                                pipeline=cfg.pipeline, dp=cfg.dp, wire=cfg.wire, groups=groups,
                                link=cfg.comm.link, seed=cfg.train.seed,
                                loss_fn=task_named(data.task),
                                optimizer=sgd if asynchronous else None,
                                stream=steps if asynchronous else 0, recorder=rec,
                                delay_rule=cfg.optim.delay_rule)
    log.notice(ctx, pipe.delay_line)
    optimizer = optimizers[0] if optimizers else make_sgd(pipe.module, cfg.optim)
    return PipelineEngine(cfg, pipe, optimizer, rec, split)
