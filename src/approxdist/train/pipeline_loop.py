"""The pipeline-parallel trainer: one stage per rank (GPipe, PipeDream-Flush; seeds 000 and 002).

Every rank draws the same mini-batches (`ShardedBatches` with a world of one, so all
stages agree on the order); stage 0 feeds the inputs, the last stage the labels, the
others only need the batch size. Each mini-batch runs as M micro-batches through the
schedule, then every stage takes one optimiser step on its own parameters. Evaluation
is a forward-only pipeline; accuracy and loss come from the last stage and reach rank 0
(which writes `metrics.jsonl`) by an all-reduce, as do per-link bytes and the per-stage
compute / communication / wait times. Each rank checkpoints its own stage under
`stage<s>/checkpoint.pt`. A recorder (docs/tracing.md) gets each mini-batch as a
`step` span holding `data`, the executor's phases and `optimizer`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from approxdist.config.schema import Config
from approxdist.data import ShardedBatches, TensorDataset, load_dataset
from approxdist.data.loader import _mix
from approxdist.errors import ApproxDistError
from approxdist.launch.context import DistContext
from approxdist.models import build_model
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.executor import StepTimes
from approxdist.pipeline.runtime import PipelineRuntime, build_runtime, check_run
from approxdist.trace import DATA, NULL_RECORDER, OPTIMIZER, STEP, Recorder
from approxdist.train import log
from approxdist.train.checkpoint import load_checkpoint, save_checkpoint
from approxdist.train.loop import Progress, run_summary
from approxdist.train.metrics import MetricsWriter
from approxdist.train.optim import LRRule, make_sgd, set_lr

#: per-rank numbers gathered each epoch, before the bytes sent to each rank
_ROW = ("compute_s", "comm_s", "wait_s", "peak_activation_bytes", "loss_sum", "correct", "seen")


def gather_rows(row: list[float], ctx: DistContext) -> torch.Tensor:
    """(world, len(row)) float64 table of every rank's row (an all-reduce of a padded table)."""
    table = torch.zeros(ctx.world_size, len(row), dtype=torch.float64)
    table[ctx.rank] = torch.tensor(row, dtype=torch.float64)
    if ctx.distributed:
        dist.all_reduce(table)
    return table


@dataclass
class PipelineTrainer:
    cfg: Config
    ctx: DistContext
    run_dir: Path
    data: TensorDataset
    runtime: PipelineRuntime
    optimizer: torch.optim.SGD
    batches: ShardedBatches
    lr_rule: LRRule
    writer: MetricsWriter
    progress: Progress = field(default_factory=Progress)
    rec: Recorder = NULL_RECORDER  # timeline phases (docs/tracing.md)

    @property
    def first(self) -> bool:
        return self.runtime.transport.is_first

    @property
    def last(self) -> bool:
        return self.runtime.transport.is_last

    def _sent(self) -> list[float]:
        sent = self.runtime.link.stats.sent
        return [float(sent.get(r, 0)) for r in range(self.ctx.world_size)]

    # -- one epoch ------------------------------------------------------------------
    def train_epoch(self, epoch: int) -> dict[str, Any]:
        cfg, ctx, rt = self.cfg, self.ctx, self.runtime
        torch.manual_seed(_mix(cfg.train.seed, epoch, ctx.rank))  # dropout etc. per epoch
        rt.module.train()
        times, peak, losses = StepTimes(), 0, []
        sums = [0.0, 0.0, 0.0]
        sent0 = self._sent()
        bar = log.progress(ctx, self.batches.steps_per_epoch,
                           f"epoch {epoch + 1}/{cfg.train.epochs}", cfg.train.progress)
        t_epoch = time.perf_counter()
        batches = self.batches.epoch(epoch)
        for _ in range(self.batches.steps_per_epoch):
            with self.rec.span(STEP, step=self.progress.step):
                x, y, n = self.next_batch(batches)
                set_lr(self.optimizer, self.lr_rule(self.progress.step))
                res = rt.executor.train_step(x, y, n)
                with self.rec.span(OPTIMIZER):
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
            times += res.times
            peak = max(peak, res.peak_activation_bytes)
            losses.append(res.loss)
            if self.last:  # loss and hits exist on the last stage only
                sums = [sums[0] + res.loss * res.samples, sums[1] + res.correct,
                        sums[2] + res.samples]
            self.progress.step += 1
            bar.update(1)
        bar.close()
        wall = time.perf_counter() - t_epoch
        sent = [b - a for a, b in zip(sent0, self._sent())]
        table = gather_rows([times.compute_s, times.comm_s, times.wait_s, peak, *sums, *sent], ctx)
        self._log_steps(epoch, losses)
        return self._epoch_stats(table, wall)

    def next_batch(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
                   ) -> tuple[torch.Tensor | None, torch.Tensor | None, int]:
        """(inputs on stage 0, labels on the last stage, batch size), on this rank's device."""
        with self.rec.span(DATA):
            x, y = next(batches)
            dev = self.ctx.device
            return (x.to(dev) if self.first else None, y.to(dev) if self.last else None,
                    y.numel())

    def _log_steps(self, epoch: int, losses: list[float]) -> None:
        """Step records (loss from the last stage) for every `log_every`-th step."""
        t = torch.tensor(losses if self.last else [0.0] * len(losses), dtype=torch.float64)
        if self.ctx.distributed:
            dist.all_reduce(t)
        first_step = self.progress.step - len(losses)
        for i, loss in enumerate(t.tolist()):
            step = first_step + i + 1
            if step % self.cfg.train.log_every == 0:
                self.writer.write({"kind": "step", "epoch": epoch + 1, "step": step,
                                   "loss": loss, "lr": self.lr_rule(step - 1)})

    def _epoch_stats(self, table: torch.Tensor, wall: float) -> dict[str, Any]:
        k, world = len(_ROW), self.ctx.world_size
        steps = max(1, self.batches.steps_per_epoch)
        stage_rows = [{name: float(table[r, i]) for i, name in enumerate(_ROW[:4])}
                      for r in range(world)]
        seen = float(table[:, 6].sum())
        return {
            "train_loss": float(table[:, 4].sum()) / seen,
            "train_accuracy": float(table[:, 5].sum()) / seen,
            "epoch_time_s": wall,
            "samples_per_s": seen / wall,
            "time_compute_s": float(table[:, 0].mean()),
            "time_comm_s": float(table[:, 1].mean()),
            "time_wait_s": float(table[:, 2].mean()),
            "step_time_s": wall / steps,
            "stages": [{"stage": r, **{n: v / steps if n.endswith("_s") else v
                                       for n, v in row.items()}} for r, row in
                       enumerate(stage_rows)],
            "bytes_sent": {f"{r}->{p}": int(table[r, k + p]) for r in range(world)
                           for p in range(world) if table[r, k + p] > 0},
        }

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """(test accuracy, mean test loss): forward-only pipeline, counted on the last stage."""
        rt, bs = self.runtime, self.cfg.data.test_batch_size
        rt.module.eval()
        rt.compute.reset_step()
        x_all, y_all = self.data.test_x, self.data.test_y
        for lo in range(0, x_all.shape[0], bs):
            x, y = x_all[lo:lo + bs], y_all[lo:lo + bs]
            rt.executor.eval_batch(x.to(self.ctx.device) if self.first else None,
                                   y.to(self.ctx.device) if self.last else None, y.numel())
        rt.module.train()
        seen = float(y_all.numel()) if self.last else 0.0
        row = [float(rt.compute.loss_sum), float(rt.compute.correct), seen]
        sums = gather_rows(row, self.ctx).sum(0)
        return float(sums[1] / sums[2]), float(sums[0] / sums[2])

    # -- the run --------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg, prog = self.cfg, self.progress
        try:
            for epoch in range(prog.epoch, cfg.train.epochs):
                stats = self.train_epoch(epoch)
                acc, test_loss = self.evaluate()
                prog.epoch = epoch + 1
                prog.elapsed_s += stats["epoch_time_s"]
                prog.bytes_sent += sum(stats["bytes_sent"].values())
                record = {"kind": "epoch", "epoch": prog.epoch, "step": prog.step, **stats,
                          "test_accuracy": acc, "test_loss": test_loss}
                prog.history.append(record)
                self.writer.write(record)
                log.info(self.ctx, f"epoch {prog.epoch:3d}/{cfg.train.epochs}  loss "
                         f"{stats['train_loss']:.4f}  train {100 * stats['train_accuracy']:.2f}%"
                         f"  test {100 * acc:.2f}%  {stats['samples_per_s']:.0f} samples/s")
                self.stage_dir.mkdir(parents=True, exist_ok=True)
                save_checkpoint(self.stage_dir, self.state_dict())
        finally:
            self.runtime.close()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        p, rt = self.cfg.pipeline, self.runtime
        return {**run_summary(self.progress, self.cfg, self.ctx.world_size),
                "stages": rt.partition.num_stages, "partition": rt.partition.describe(),
                "schedule": p.schedule, "microbatches": p.microbatches,
                "fwd_codec": p.fwd_codec, "bwd_codec": p.bwd_codec, "recompute": p.recompute,
                "fuse_accumulation": p.fuse_accumulation}

    # -- checkpoints (one per stage) --------------------------------------------------
    @property
    def stage_dir(self) -> Path:
        return self.run_dir / f"stage{self.runtime.stage}"

    def state_dict(self) -> dict[str, Any]:
        p = self.progress
        return {"model": self.runtime.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                "boundaries": list(self.runtime.partition.boundaries), "epoch": p.epoch,
                "step": p.step, "elapsed_s": p.elapsed_s, "bytes_sent": p.bytes_sent,
                "history": p.history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        cut = tuple(state["boundaries"])
        if cut != self.runtime.partition.boundaries:
            raise PipelineError(f"checkpoint of stage {self.runtime.stage} was cut at {cut}, "
                                f"this run at {self.runtime.partition.boundaries}; resume with "
                                f"the original --split")
        self.runtime.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.progress = Progress(state["epoch"], state["step"], state["elapsed_s"],
                                 state["bytes_sent"], list(state["history"]))
        epochs = gather_rows([float(self.progress.epoch)], self.ctx)[:, 0].tolist()
        if len(set(epochs)) > 1:
            raise PipelineError("stage checkpoints disagree: " + ", ".join(
                f"stage {s} at epoch {int(e)}" for s, e in enumerate(epochs))
                + "; a stage died while saving, restart from scratch")


def build_pipeline_trainer(cfg: Config, ctx: DistContext, run_dir: Path, resume: bool,
                           rec: Recorder = NULL_RECORDER) -> PipelineTrainer:
    """Build this rank's stage and trainer (collective: all ranks call it together);
    `rec` records its phases and transfers."""
    run_dir.mkdir(parents=True, exist_ok=True)
    data = load_dataset(cfg.data)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(ctx.device)
    check_run(cfg.pipeline, ctx.world_size, len(model), cfg.data.batch_size)
    micro = max(1, cfg.data.batch_size // cfg.pipeline.microbatches)
    runtime = build_runtime(cfg.pipeline, model, ctx, data.train_x[:micro].to(ctx.device),
                            link_spec=cfg.comm.link, seed=cfg.train.seed, rec=rec)
    optimizer = make_sgd(runtime.module, cfg.optim)
    augment = cfg.data.augment and runtime.transport.is_first  # labels do not depend on it
    batches = ShardedBatches(data, cfg.data.batch_size, 0, 1, cfg.train.seed, augment)
    rule = LRRule(cfg.optim, cfg.data.batch_size, batches.steps_per_epoch, cfg.train.epochs)
    trainer = PipelineTrainer(cfg, ctx, run_dir, data, runtime, optimizer, batches, rule,
                              MetricsWriter(run_dir, ctx.is_main), rec=rec)
    if resume:
        trainer.load_state_dict(_load_stage_checkpoint(trainer.stage_dir, ctx))
    return trainer


def _load_stage_checkpoint(stage_dir: Path, ctx: DistContext) -> dict[str, Any]:
    """This stage's checkpoint; every rank raises if any stage lacks one (no rank hangs)."""
    state: dict[str, Any] | None = None
    error: ApproxDistError | None = None
    try:
        state = load_checkpoint(stage_dir)
    except ApproxDistError as exc:
        error = exc
    missing = gather_rows([1.0 if error else 0.0], ctx)[:, 0].tolist()
    if error is not None:
        raise error
    if any(missing):
        bad = ", ".join(f"stage {s}" for s, m in enumerate(missing) if m)
        raise PipelineError(f"cannot resume: no readable checkpoint for {bad}")
    assert state is not None
    return state
