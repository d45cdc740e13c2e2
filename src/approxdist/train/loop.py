"""The training loop: holds small parts (data, model, optimiser, gradient sync, outputs)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.config.schema import Config
from approxdist.data import ShardedBatches, TensorDataset, load_dataset
from approxdist.data.loader import _mix
from approxdist.data_parallel.sync import GradientSync, build_sync
from approxdist.launch.context import DistContext
from approxdist.models import build_model
from approxdist.trace import DATA, NULL_RECORDER, OPTIMIZER, RUN_BACK, RUN_FOR, STEP, Recorder
from approxdist.train import log
from approxdist.train.checkpoint import load_checkpoint, save_checkpoint
from approxdist.train.evaluate import all_mean, evaluate
from approxdist.train.metrics import MetricsWriter
from approxdist.train.optim import LRRule, make_sgd, set_lr


@dataclass
class Progress:
    """What a checkpoint must carry to continue bit-exactly."""

    epoch: int = 0
    step: int = 0
    elapsed_s: float = 0.0
    bytes_sent: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Trainer:
    cfg: Config
    ctx: DistContext
    run_dir: Path
    data: TensorDataset
    model: nn.Module
    optimizer: torch.optim.SGD
    batches: ShardedBatches
    lr_rule: LRRule
    sync: GradientSync | None
    writer: MetricsWriter
    progress: Progress = field(default_factory=Progress)
    link_bytes: dict[str, int] = field(default_factory=dict)  # per link, at the last epoch
    rec: Recorder = NULL_RECORDER  # timeline phases (docs/tracing.md)

    # -- one epoch ---------------------------------------------------------------
    def train_epoch(self, epoch: int) -> dict[str, Any]:
        cfg, ctx = self.cfg, self.ctx
        torch.manual_seed(_mix(cfg.train.seed, epoch, ctx.rank))  # dropout etc. per epoch
        self.model.train()
        sums = {"loss": 0.0, "correct": 0.0, "seen": 0.0, "compute": 0.0, "comm": 0.0}
        comm0 = self.sync.comm_seconds if self.sync else 0.0
        bar = log.progress(ctx, self.batches.steps_per_epoch,
                           f"epoch {epoch + 1}/{cfg.train.epochs}", cfg.train.progress)
        t_epoch = time.perf_counter()
        batches = self.batches.epoch(epoch)
        for _ in range(self.batches.steps_per_epoch):
            with self.rec.span(STEP, step=self.progress.step):
                x, y = self.next_batch(batches)
                loss, correct = self.train_step(x, y)
            sums["loss"] += loss * y.numel()
            sums["correct"] += correct
            sums["seen"] += y.numel()
            self.progress.step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
            if self.progress.step % cfg.train.log_every == 0:
                self.writer.write({"kind": "step", "epoch": epoch + 1, "step": self.progress.step,
                                   "loss": loss, "lr": self.optimizer.param_groups[0]["lr"]})
        bar.close()
        wall = time.perf_counter() - t_epoch
        comm = (self.sync.comm_seconds - comm0) if self.sync else 0.0
        loss_mean, acc, = all_mean([sums["loss"] / sums["seen"], sums["correct"] / sums["seen"]],
                                   ctx)
        return {"train_loss": loss_mean, "train_accuracy": acc, "epoch_time_s": wall,
                "step_time_s": wall / max(1, self.batches.steps_per_epoch),
                "samples_per_s": self.batches.steps_per_epoch * self.cfg.data.batch_size / wall,
                "time_comm_s": comm, "time_compute_s": wall - comm}

    def next_batch(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        with self.rec.span(DATA):
            x, y = next(batches)
            return x.to(self.ctx.device), y.to(self.ctx.device)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        rec = self.rec
        set_lr(self.optimizer, self.lr_rule(self.progress.step))
        with rec.span(RUN_FOR):
            out = self.model(x)
            loss = F.cross_entropy(out, y)
        with rec.span(OPTIMIZER):
            self.optimizer.zero_grad(set_to_none=True)
        with rec.span(RUN_BACK):
            loss.backward()
        if self.sync:
            self.sync.sync_gradients()
        if not (self.sync and self.sync.owns_step):  # early forward steps bucket by bucket
            with rec.span(OPTIMIZER):
                self.optimizer.step()
        return float(loss.item()), float((out.argmax(1) == y).sum().item())

    # -- the run ------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg, ctx, prog = self.cfg, self.ctx, self.progress
        for epoch in range(prog.epoch, cfg.train.epochs):
            stats = self.train_epoch(epoch)
            if self.sync:
                self.sync.sync_buffers()
            acc, test_loss = evaluate(self.model, self.data, ctx, cfg.data.test_batch_size)
            prog.epoch = epoch + 1
            prog.elapsed_s += stats["epoch_time_s"]
            bytes_now = self.sync.bytes_sent if self.sync else 0
            record = {"kind": "epoch", "epoch": prog.epoch, "step": prog.step, **stats,
                      "test_accuracy": acc, "test_loss": test_loss,
                      "bytes_sent": self._link_bytes_delta(),
                      "time_wait_s": 0.0}
            prog.bytes_sent = bytes_now
            prog.history.append(record)
            self.writer.write(record)
            log.info(ctx, f"epoch {prog.epoch:3d}/{cfg.train.epochs}  loss {stats['train_loss']:.4f}"
                          f"  train {100 * stats['train_accuracy']:.2f}%  test {100 * acc:.2f}%"
                          f"  {stats['samples_per_s']:.0f} samples/s")
            state = self.state_dict()  # on every rank: the dp engine gathers per-rank state
            if ctx.is_main:
                save_checkpoint(self.run_dir, state)
        return self.summary()

    def _link_bytes_delta(self) -> dict[str, int]:
        """Bytes sent per directed link during the last epoch (a collective)."""
        now = self.sync.world_link_bytes() if self.sync else {}
        delta = {k: v - self.link_bytes.get(k, 0) for k, v in now.items()}
        self.link_bytes = now
        return delta

    def summary(self) -> dict[str, Any]:
        return run_summary(self.progress, self.cfg, self.ctx.world_size)

    # -- checkpoints --------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        p = self.progress
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "epoch": p.epoch, "step": p.step, "elapsed_s": p.elapsed_s,
                "bytes_sent": p.bytes_sent, "history": p.history,
                "dp": self.sync.checkpoint_state() if self.sync else {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.progress = Progress(state["epoch"], state["step"], state["elapsed_s"],
                                 state["bytes_sent"], list(state["history"]))
        if self.sync:
            self.sync.bytes_sent = self.progress.bytes_sent
            self.sync.load_checkpoint_state(state.get("dp", {}))


def run_summary(progress: Progress, cfg: Config, world_size: int) -> dict[str, Any]:
    """summary.json's figures from the epoch history (shared by the dp and pipeline trainers)."""
    hist = progress.history
    last = hist[-1] if hist else {}
    samples = sum(h["samples_per_s"] * h["epoch_time_s"] for h in hist)
    return {
        "test_accuracy": last.get("test_accuracy"),
        "best_test_accuracy": max((h["test_accuracy"] for h in hist), default=None),
        "train_loss": last.get("train_loss"),
        "train_accuracy": last.get("train_accuracy"),
        "epochs": progress.epoch,
        "steps": progress.step,
        "wall_time_s": progress.elapsed_s,
        "samples_per_s": samples / progress.elapsed_s if progress.elapsed_s else None,
        "bytes_sent": progress.bytes_sent,
        "world_size": world_size,
        "parallel": cfg.train.parallel,
        "model": cfg.model.name,
        "dataset": cfg.data.dataset,
    }


def build_trainer(cfg: Config, ctx: DistContext, run_dir: Path, resume: bool,
                  rec: Recorder = NULL_RECORDER) -> Trainer:
    """This rank's trainer (collective when distributed); `rec` records its phases."""
    run_dir.mkdir(parents=True, exist_ok=True)
    data = load_dataset(cfg.data)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(ctx.device)
    optimizer = make_sgd(model, cfg.optim)
    sync = build_sync(cfg, model, optimizer, ctx, rec) if ctx.distributed else None
    batches = ShardedBatches(data, cfg.data.batch_size, ctx.rank, ctx.world_size,
                             cfg.train.seed, cfg.data.augment)
    rule = LRRule(cfg.optim, cfg.data.batch_size, batches.steps_per_epoch, cfg.train.epochs)
    trainer = Trainer(cfg, ctx, run_dir, data, model, optimizer, batches, rule, sync,
                      MetricsWriter(run_dir, ctx.is_main), rec=rec)
    if resume:
        state = [load_checkpoint(run_dir) if ctx.is_main else None]
        if ctx.distributed:
            dist.broadcast_object_list(state, src=0)
        assert state[0] is not None
        trainer.load_state_dict(state[0])
    if sync:
        sync.broadcast_parameters()
    return trainer
