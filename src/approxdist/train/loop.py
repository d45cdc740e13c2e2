"""The training loop: holds small parts (data, model, optimiser, gradient sync, outputs)."""

from __future__ import annotations

import time
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
from approxdist.data_parallel.plain import PlainAllReduce
from approxdist.launch.context import DistContext
from approxdist.models import build_model
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
    sync: PlainAllReduce | None
    writer: MetricsWriter
    progress: Progress = field(default_factory=Progress)

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
        for x, y in self.batches.epoch(epoch):
            loss, correct = self.train_step(x.to(ctx.device), y.to(ctx.device))
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
                "samples_per_s": self.batches.steps_per_epoch * self.cfg.data.batch_size / wall,
                "time_comm_s": comm, "time_compute_s": wall - comm}

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        set_lr(self.optimizer, self.lr_rule(self.progress.step))
        out = self.model(x)
        loss = F.cross_entropy(out, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.sync:
            self.sync.sync_gradients()
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
                      "bytes_sent": {"allreduce:native": bytes_now - prog.bytes_sent},
                      "time_wait_s": 0.0}
            prog.bytes_sent = bytes_now
            prog.history.append(record)
            self.writer.write(record)
            log.info(ctx, f"epoch {prog.epoch:3d}/{cfg.train.epochs}  loss {stats['train_loss']:.4f}"
                          f"  train {100 * stats['train_accuracy']:.2f}%  test {100 * acc:.2f}%"
                          f"  {stats['samples_per_s']:.0f} samples/s")
            if ctx.is_main:
                save_checkpoint(self.run_dir, self.state_dict())
        return self.summary()

    def summary(self) -> dict[str, Any]:
        hist = self.progress.history
        last = hist[-1] if hist else {}
        samples = sum(h["samples_per_s"] * h["epoch_time_s"] for h in hist)
        return {
            "test_accuracy": last.get("test_accuracy"),
            "best_test_accuracy": max((h["test_accuracy"] for h in hist), default=None),
            "train_loss": last.get("train_loss"),
            "train_accuracy": last.get("train_accuracy"),
            "epochs": self.progress.epoch,
            "steps": self.progress.step,
            "wall_time_s": self.progress.elapsed_s,
            "samples_per_s": samples / self.progress.elapsed_s if self.progress.elapsed_s else None,
            "bytes_sent": self.progress.bytes_sent,
            "world_size": self.ctx.world_size,
            "parallel": self.cfg.train.parallel,
            "model": self.cfg.model.name,
            "dataset": self.cfg.data.dataset,
        }

    # -- checkpoints --------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        p = self.progress
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "epoch": p.epoch, "step": p.step, "elapsed_s": p.elapsed_s,
                "bytes_sent": p.bytes_sent, "history": p.history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.progress = Progress(state["epoch"], state["step"], state["elapsed_s"],
                                 state["bytes_sent"], list(state["history"]))
        if self.sync:
            self.sync.bytes_sent = self.progress.bytes_sent


def build_trainer(cfg: Config, ctx: DistContext, run_dir: Path, resume: bool) -> Trainer:
    run_dir.mkdir(parents=True, exist_ok=True)
    data = load_dataset(cfg.data)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(ctx.device)
    sync = PlainAllReduce(model, ctx) if ctx.distributed else None
    optimizer = make_sgd(model, cfg.optim)
    batches = ShardedBatches(data, cfg.data.batch_size, ctx.rank, ctx.world_size,
                             cfg.train.seed, cfg.data.augment)
    rule = LRRule(cfg.optim, cfg.data.batch_size, batches.steps_per_epoch, cfg.train.epochs)
    trainer = Trainer(cfg, ctx, run_dir, data, model, optimizer, batches, rule, sync,
                      MetricsWriter(run_dir, ctx.is_main))
    if resume:
        state = [load_checkpoint(run_dir) if ctx.is_main else None]
        if ctx.distributed:
            dist.broadcast_object_list(state, src=0)
        assert state[0] is not None
        trainer.load_state_dict(state[0])
    if sync:
        sync.broadcast_parameters()
    return trainer
