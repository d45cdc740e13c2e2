"""The one training loop: epochs, learning rate, evaluation, metrics, checkpoints, resume.

The trainer holds an `Engine` (`train/engine.py`) for the run's parallel mode and owns
everything the modes share: the epoch loop and progress bar, the learning-rate rule
set on the engine's optimisers every step, evaluation on this rank's shard of the test
set, the records of `metrics.jsonl` (step and epoch, `train/epoch.py`; through the sink,
`train/sink.py`, which may also write them to TensorBoard), `summary.json`'s
figures, atomic checkpoints and bit-exact resume (`train/resume.py`), and the error a
run ends with when a peer dies: naming that rank and its place in the mesh. A
recorder (docs/tracing.md) gets each mini-batch as a `step` span holding `data` and the
engine's phases. An engine may skip ahead (`StepOutcome.skip`: the steps it skips, their
data unused; an N+b parameter-server worker whose gradient was dropped); each rank's
epoch record row counts its skipped steps. Step hooks run before every step with the run's position
(`snapshot.Position`) and may add records to metrics.jsonl; AdaPrec is one
(`train/speculation.py`), speculating through `train_steps`, the loop's own step, and
handing the winner's speculative steps back to the loop (`Trainer.ahead`). A loss that
turns NaN or infinite is reported with its step and, unless `train.on_divergence` is
"continue", ends the run after that epoch.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from approxdist.config.schema import Config
from approxdist.data import ShardedBatches, TensorDataset
from approxdist.data.loader import eval_shard, mix_seed
from approxdist.errors import ApproxDistError, CommError
from approxdist.launch.context import DistContext
from approxdist.optim.delay import rule_momentum, stable_rate
from approxdist.topology import Mesh
from approxdist.topology.groups import MeshGroups
from approxdist.trace import DATA, NULL_RECORDER, STEP, Recorder
from approxdist.train import log
from approxdist.train.engine import Engine, StepOutcome
from approxdist.train.epoch import EpochTally, bytes_delta, gather_epoch, step_losses
from approxdist.train.mode import mode_of
from approxdist.train.optim import BatchGrowth, LRRule, noise_scale, set_lr
from approxdist.train.resume import Progress, checkpoint_dir, load_agreed, save_agreed
from approxdist.train.sink import MetricsSink
from approxdist.train.snapshot import Position
from approxdist.train.straggler import Stragglers

#: under torchrun, how long a rank that fails mid-run waits before it exits: torchrun's
#: agent reports the first rank it polls as failed, and when a peer died it then sees the
#: dead peer first and names it as the cause, not this rank that merely lost its
#: connection (our own launchers see every death in order: `launch/ranks.py`)
FAIL_LINGER_S = 2.0
#: set by torchrun's agent in every worker it starts
TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"

#: called with the epoch index (0-based) before each epoch trains (e.g. to sample activations)
EpochHook = Callable[[int], None]
#: called with the run's position before each step; may return a record for metrics.jsonl
#: (AdaPrec, `train/speculation.py`: it speculates through `Trainer.train_steps`)
StepHook = Callable[[Position], "Mapping[str, Any] | None"]


@dataclass
class Trainer:
    """Trains `engine` on `data` for `cfg.train.epochs`, writing into `run_dir`."""

    cfg: Config
    ctx: DistContext
    run_dir: Path
    data: TensorDataset
    engine: Engine
    groups: MeshGroups
    batches: ShardedBatches
    lr_rule: LRRule
    #: where the step, epoch and hook records go (metrics.jsonl, TensorBoard: train/sink.py)
    sink: MetricsSink
    progress: Progress = field(default_factory=Progress)
    rec: Recorder = NULL_RECORDER
    epoch_hooks: list[EpochHook] = field(default_factory=list)
    stragglers: Stragglers = field(default_factory=Stragglers)
    step_hooks: list[StepHook] = field(default_factory=list)
    #: steps a step hook already trained from the run's position, with the run's batches
    #: and rates (AdaPrec going on from its winner's speculation): the loop counts them as
    #: its own next steps and goes on after them; they must end within the epoch
    ahead: list[StepOutcome] = field(default_factory=list)
    #: figures for summary.json from the parts hooked into the run (e.g. AdaPrec's)
    summaries: list[Callable[[], dict[str, Any]]] = field(default_factory=list)
    #: the global batch of each epoch (constant unless optim.schedule = "grow")
    growth: BatchGrowth = field(init=False)

    def __post_init__(self) -> None:
        self.growth = BatchGrowth(self.cfg.optim, self.cfg.data.batch_size,
                                  self.data.train_x.shape[0], self.batches.world)

    # -- one epoch -------------------------------------------------------------------------
    def train_epoch(self, epoch: int) -> dict[str, Any]:
        cfg, ctx, engine = self.cfg, self.ctx, self.engine
        self.seed_epoch(epoch)
        engine.module.train()
        global_batch = self.growth.batch_at(epoch)
        steps = self.shards(epoch).steps_per_epoch
        tally = EpochTally(steps)
        sent0 = engine.link_bytes()
        bar = log.progress(ctx, steps, f"epoch {epoch + 1}/{cfg.train.epochs}", cfg.train.progress)
        t_epoch = time.perf_counter()
        batches = self.shards(epoch).epoch(epoch)
        i = 0
        while i < steps:
            self._run_step_hooks(Position(epoch, i, self.progress.step))
            if self.ahead:  # a hook trained the next steps already: they are the run's
                n = self._take_ahead(tally, i, steps)
                i += n
                self.progress.step += n
                bar.update(n)
                batches = self.shards(epoch).epoch(epoch, i)
                continue
            with self.rec.span(STEP, step=self.progress.step):
                res = self.step(batches, epoch, self.progress.step)
            tally.add(i, res)
            skip = min(res.skip, steps - i - 1)  # the engine skips ahead (N+b)
            if skip:
                tally.skipped += skip
                batches = self.shards(epoch).epoch(epoch, i + 1 + skip)
            i += 1 + skip
            self.progress.step += 1 + skip
            bar.update(1 + skip)
            if res.loss is not None:
                bar.set_postfix(loss=f"{res.loss:.3f}")
        bar.close()
        wall = time.perf_counter() - t_epoch
        losses = step_losses(tally, self.groups.world)
        self._log_steps(epoch, losses, tally.records)
        stats = gather_epoch(tally, bytes_delta(engine.link_bytes(), sent0), self.groups.world,
                             self.groups.mesh, wall, global_batch)
        bad = first_nonfinite(losses)
        if bad is not None:  # every rank has the same losses, so all agree on it
            stats["diverged_at_step"] = self.progress.step - len(losses) + bad + 1
            stats["diverged_loss"] = losses[bad]
        return {**stats, "batch_size": global_batch}

    def seed_epoch(self, epoch: int) -> None:
        """Dropout etc.: seeded per epoch and place in the mesh (so placement changes
        nothing), as the loop and a speculation crossing into the epoch both need."""
        torch.manual_seed(mix_seed(self.cfg.train.seed, epoch,
                               self.groups.mesh.slot(self.ctx.rank)))

    def shards(self, epoch: int) -> ShardedBatches:
        """This rank's batches in epoch `epoch` (the batch may grow between epochs)."""
        return self.batches.resized(self.growth.batch_at(epoch))

    def step(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], epoch: int,
             step: int) -> StepOutcome:
        """One step on the next batch of `batches` (epoch `epoch`'s), at `step`'s rate,
        after this rank's straggler delay (speculative steps are slowed alike)."""
        self.stragglers.pause(self.ctx.rank, step, self.engine.wires().values()
                              if self.stragglers.by_codec else ())
        x, y = self.next_batch(batches)
        lr = self.lr_rule(step) * self.growth.lr_factor(epoch)
        for opt in self.engine.optimizers:
            set_lr(opt, lr)
        return self.engine.train_step(x, y, self.shards(epoch).local_batch)

    def train_steps(self, at: Position, steps: int) -> list[StepOutcome]:
        """Train `steps` steps from `at` (into the next epochs if need be) without logging
        them or moving the run's progress: the speculation of AdaPrec, which restores the
        run's snapshot afterwards (`train/snapshot.py`) or hands the steps to the loop
        (`ahead`). Within an epoch they compute what the loop would; a new epoch reseeds
        the generators as the loop does (its end-of-epoch buffer sync and evaluation are
        not run)."""
        outs: list[StepOutcome] = []
        epoch, index = at.epoch, at.index
        while len(outs) < steps:
            if epoch != at.epoch:
                self.seed_epoch(epoch)
            shards = self.shards(epoch)
            batches = shards.epoch(epoch, index)
            for _ in range(min(steps - len(outs), shards.steps_per_epoch - index)):
                outs.append(self.step(batches, epoch, at.step + len(outs)))
            epoch, index = epoch + 1, 0
        return outs

    def _take_ahead(self, tally: EpochTally, i: int, steps: int) -> int:
        """Count the steps in `ahead` as the epoch's steps `i`, `i + 1`, ...; how many."""
        outs, self.ahead = self.ahead, []
        if i + len(outs) > steps or any(o.skip for o in outs):
            raise ApproxDistError(f"a step hook trained {len(outs)} steps ahead from batch {i} "
                                  f"of {steps}: steps ahead must stay in their epoch and "
                                  f"skip none")
        for k, res in enumerate(outs):
            tally.add(i + k, res)
        return len(outs)

    def _run_step_hooks(self, at: Position) -> None:
        for hook in self.step_hooks:
            record = hook(at)
            if record is not None:
                self.sink.write({"epoch": at.epoch + 1, **record})

    def next_batch(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
                   ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """This rank's share of the next batch: the inputs and labels its engine needs."""
        with self.rec.span(DATA):
            x, y = next(batches)
            dev = self.ctx.device
            return (x.to(dev) if self.engine.feeds_inputs else None,
                    y.to(dev) if self.engine.feeds_labels else None)

    def _log_steps(self, epoch: int, losses: list[float | None],
                   records: list[Mapping[str, Any]]) -> None:
        """Step records (the step's loss, with the engine's extra fields) for every
        `log_every`-th step."""
        first_step = self.progress.step - len(losses)
        for i, loss in enumerate(losses):
            step = first_step + i + 1
            if step % self.cfg.train.log_every == 0:
                self.sink.write({"kind": "step", "epoch": epoch + 1, "step": step,
                                 "loss": loss, "lr": self.lr_rule(step - 1), **records[i]})

    # -- evaluation -------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """(test accuracy, mean test loss) over the whole test set (a collective)."""
        engine, bs = self.engine, self.cfg.data.test_batch_size
        engine.module.eval()
        x_all, y_all = eval_shard(self.data, *engine.shard)
        sums = torch.zeros(3, dtype=torch.float64)
        dev = self.ctx.device
        for lo in range(0, x_all.shape[0], bs):
            x, y = x_all[lo:lo + bs], y_all[lo:lo + bs]
            counted = engine.eval_batch(x.to(dev) if engine.feeds_inputs else None,
                                        y.to(dev) if engine.feeds_labels else None, y.shape[0])
            sums += torch.tensor(counted, dtype=torch.float64)
        engine.module.train()
        self.groups.world.all_reduce(sums)
        return float(sums[1] / sums[2]), float(sums[0] / sums[2])

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train the remaining epochs; summary.json's figures. A lost peer ends the run with
        an error naming it and its place in the mesh."""
        try:
            self.sink.open(self.progress.step)
            fixed = {name: codec for name, codec in self.engine.wires().items()
                     if not self.cfg.wire.wire(name).adaptive}  # AdaPrec reports its own
            if fixed:
                self.sink.write({"kind": "wires", "step": self.progress.step, "wires": fixed})
            for epoch in range(self.progress.epoch, self.cfg.train.epochs):
                self.run_epoch(epoch)
                if self._diverged(epoch):
                    break
        except (ApproxDistError, RuntimeError) as exc:
            if self.ctx.world_size > 1 and TORCHRUN_ENV in os.environ:
                time.sleep(FAIL_LINGER_S)
            named = name_lost_peer(exc, self.groups.mesh, self.ctx.rank)
            if named is exc:
                raise
            raise named from exc
        finally:
            try:
                self.engine.close()
            finally:
                self.sink.close()
        return self.summary()

    def run_epoch(self, epoch: int) -> None:
        cfg, prog = self.cfg, self.progress
        for hook in self.epoch_hooks:
            hook(epoch)
        stats = self.train_epoch(epoch)
        self.engine.end_epoch()
        acc, test_loss = self.evaluate()
        prog.epoch = epoch + 1
        prog.elapsed_s += stats["epoch_time_s"]
        prog.bytes_sent += sum(stats["bytes_sent"].values())
        # the rate and batch of the epoch's last step
        lr = self.lr_rule(max(0, prog.step - 1)) * self.growth.lr_factor(epoch)
        noise = noise_scale(lr, cfg.optim.momentum, self.data.train_x.shape[0],
                            int(stats["batch_size"]))
        record = {"kind": "epoch", "epoch": prog.epoch, "step": prog.step, **stats,
                  "test_accuracy": acc, "test_loss": test_loss, "lr": lr, "noise_scale": noise}
        prog.history.append(record)
        self.sink.write(record)
        log.info(self.ctx, f"epoch {prog.epoch:3d}/{cfg.train.epochs}  loss "
                           f"{stats['train_loss']:.4f}  train {100 * stats['train_accuracy']:.2f}%"
                           f"  test {100 * acc:.2f}%  {stats['samples_per_s']:.0f} samples/s")
        self.save()

    def _diverged(self, epoch: int) -> bool:
        """Warn if `epoch` saw the run's first non-finite loss; True to stop the run."""
        record = self.progress.history[-1]
        step = record.get("diverged_at_step")
        if step is None or any("diverged_at_step" in h for h in self.progress.history[:-1]):
            return False
        stop = self.cfg.train.on_divergence == "stop"
        optim = self.cfg.optim
        log.info(self.ctx, f"approxdist: training diverged: the loss was {record['diverged_loss']} "
                           f"at step {step} (epoch {epoch + 1}); "
                           + ("stopped after this epoch (--set train.on_divergence=continue "
                              "trains on)" if stop else "training on (train.on_divergence = "
                                                       "continue)")
                           + f". A lower optim.lr (now {optim.lr}), warm-up (optim.warmup_epochs, "
                             f"now {optim.warmup_epochs}) or less momentum (now {optim.momentum}) "
                             f"may keep it finite" + _delay_hint(self.cfg))
        return stop

    def summary(self) -> dict[str, Any]:
        return {**run_summary(self.progress, self.cfg, self.ctx.world_size),
                "mesh": {"spec": self.groups.mesh.spec, "ranks": list(self.groups.mesh.ranks)},
                **self.engine.summary(), **{k: v for part in self.summaries
                                            for k, v in part().items()}}

    # -- checkpoints -------------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        return checkpoint_dir(self.run_dir, self.groups)

    def save(self) -> None:
        """This stage's checkpoint, written by its first replica (every rank calls it: the
        engine's state may be gathered over the replicas; every rank learns whether every
        stage and the metrics were written, and all stop together if not)."""
        state = self.engine.state_dict()
        save_agreed(self.run_dir, self.groups, self.progress,
                    state if self.groups.stage.is_root else None, self.sink.problem)

    def resume(self) -> None:
        """Continue from the run directory's checkpoints (a collective; every rank raises
        the same error if any stage lacks one or the stages disagree)."""
        progress, state = load_agreed(self.checkpoint_dir, self.groups)
        self.engine.load_state_dict(state)
        self.progress = progress


def name_lost_peer(exc: BaseException, mesh: Mesh, rank: int) -> BaseException:
    """`exc`, or a `CommError` naming the lost peer and its place when `exc` knows the peer."""
    peer = getattr(exc, "peer", None)
    if peer is None or not 0 <= peer < mesh.world_size:
        return exc
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return CommError(f"lost {mesh.describe_rank(peer)}, which may have died; "
                     f"{mesh.describe_rank(rank)} stopped: {first}", peer=peer)


def run_summary(progress: Progress, cfg: Config, world_size: int) -> dict[str, Any]:
    """summary.json's figures from the epoch history (the keys every mode writes)."""
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
        "skipped_steps": skipped_steps(hist, world_size),
        "diverged_at_step": next((h["diverged_at_step"] for h in hist
                                  if "diverged_at_step" in h), None),
    }


def _delay_hint(cfg: Config) -> str:
    """Why a 2BW run is more fragile than its synchronous twin, when it is one."""
    if not mode_of(cfg).reads("pipeline.schedule") or cfg.pipeline.schedule != "2bw":
        return ""
    b = rule_momentum(cfg.optim.momentum, 1, cfg.optim.delay_rule)
    return (f"; 2bw applies each gradient one step late, and on a quadratic, SGD with momentum "
            f"{b:.3g} and a one-step-late gradient is stable only for lr x curvature < "
            f"{stable_rate(b, 1):.2g}, against {stable_rate(b, 0):.2g} without the delay "
            f"(docs/pipeline.md)")


def first_nonfinite(losses: list[float | None]) -> int | None:
    """Index of the first step whose loss is NaN or infinite (None: a step without one)."""
    return next((i for i, loss in enumerate(losses)
                 if loss is not None and not math.isfinite(loss)), None)


def skipped_steps(history: list[dict[str, Any]], world_size: int) -> list[int]:
    """Per rank, the steps its engine skipped over the run (`StepOutcome.skip`)."""
    out = [0] * world_size
    for record in history:
        for row in record.get("ranks", []):
            if 0 <= row["rank"] < world_size:
                out[row["rank"]] += int(row.get("skipped_steps", 0))
    return out
