"""Single-process and data-parallel training: the whole model on every rank (seeds 001, 004).

A thin adapter over the public `approxdist.DataParallel` (or the plain one-`dist.all_reduce`
baseline; both `ReplicaReducer`s): the replicas each take a shard of every global batch
(`data.ShardedBatches`) and average their gradients over the mesh's `dp` group; with one
rank there is nothing to average. The time the training thread waited for communication is
the engine's `wait`; the time the communication threads worked, its `comm`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from approxdist.comm.update_error import Sums
from approxdist.config.schema import Config
from approxdist.data import TensorDataset
from approxdist.data_parallel.replicas import ReplicaReducer, build_reducer
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.topology.groups import MeshGroups
from approxdist.trace import OPTIMIZER, Recorder
from approxdist.trace.step import traced_backward
from approxdist.trace.times import StepTimes
from approxdist.train.engine import StepOutcome, load_trained, seeded_model, trained_state
from approxdist.train.optim import make_sgd
from approxdist.train.task import Task, task_named


class DataParallelEngine:
    """`model` on this rank; `sync` (None on one rank) averages gradients over its replicas."""

    feeds_inputs = True
    feeds_labels = True

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 groups: MeshGroups, sync: ReplicaReducer | None, rec: Recorder,
                 task: Task, codec: str = "fp32") -> None:
        self.module, self.optimizer, self.sync, self.rec = model, optimizer, sync, rec
        self.task, self.codec = task, codec
        self.optimizers = [optimizer]
        self.shard = (groups.place.replica, groups.replicas.size)
        # DataParallel is the module users call; the plain engine works on the model itself
        self._forward: nn.Module = sync if isinstance(sync, nn.Module) else model

    def train_step(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> StepOutcome:
        assert x is not None and y is not None
        rec, sync = self.rec, self.sync
        waited, worked = (sync.comm_seconds, sync.busy_seconds) if sync else (0.0, 0.0)
        t0 = time.perf_counter()
        out, loss = traced_backward(rec, self._forward, self.task, x, y,
                                    lambda: self.optimizer.zero_grad(set_to_none=True))
        if sync:
            sync.sync_gradients()
        if not (sync and sync.owns_step):  # early forward steps bucket by bucket
            with rec.span(OPTIMIZER):
                self.optimizer.step()
        wall = time.perf_counter() - t0
        wait = sync.comm_seconds - waited if sync else 0.0
        comm = sync.busy_seconds - worked if sync else 0.0
        n = self.task.predictions(y)
        return StepOutcome(float(loss.item()) * n, int(self.task.hits(out, y).item()), n,
                           StepTimes(compute_s=wall - wait, comm_s=comm, wait_s=wait, wall_s=wall))

    @torch.no_grad()
    def eval_batch(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> tuple[float, int, int]:
        assert x is not None and y is not None
        return self.task.evaluate(self.module(x), y)

    def end_epoch(self) -> None:
        if self.sync:
            self.sync.sync_buffers()

    def link_bytes(self) -> dict[str, int]:
        return self.sync.link_bytes() if self.sync else {}

    def state_dict(self) -> dict[str, Any]:
        """Model, optimiser and every replica's residuals (a collective over them)."""
        return trained_state(self.module, self.optimizer,
                             self.sync.checkpoint_state() if self.sync else {})

    def local_state(self) -> dict[str, Any]:
        """This rank's state without collectives (`train/snapshot.py`): model, optimiser and
        the reducer's error-feedback residuals."""
        return trained_state(self.module, self.optimizer,
                             self.sync.local_state() if self.sync else {})

    def load_state_dict(self, state: Mapping[str, Any], local: bool = False) -> None:
        """`state_dict()`'s state back (or `local_state()`'s, with `local`)."""
        reducer = load_trained(self.module, self.optimizer, state)
        if self.sync:
            (self.sync.load_local_state if local else self.sync.load_checkpoint_state)(reducer)

    def load_local_state(self, state: Mapping[str, Any]) -> None:
        self.load_state_dict(state, local=True)

    @torch.no_grad()
    def score_batch(self, x: torch.Tensor | None, y: torch.Tensor | None,
                    batch_size: int) -> tuple[float, int, int]:
        """(the true class's probability summed, correct, predictions) of one batch on this
        rank's share (AdaPrec's signal), in the module's current mode."""
        assert x is not None and y is not None
        return self.task.score(self.module(x), y)

    def wires(self) -> dict[str, str]:
        """The gradient wire and the codec in force on it (none on one rank)."""
        return {"grad": self.codec} if self.sync else {}

    def set_wire(self, name: str, codec: str, rules: tuple[str, ...] = ()) -> None:
        """Switch the gradient wire's codecs (AdaPrec), its error-feedback residuals kept
        per parameter; needs `DataParallel`."""
        if name != "grad" or not self.sync:
            raise ConfigError(f"switching wire {name!r} during training needs the "
                              f"data-parallel gradient wire on 2 or more ranks (wire 'grad'); "
                              f"use --world-size 2 (or more)")
        self.sync.set_codecs(rules, codec)
        self.codec = codec

    def update_error(self, measure: bool) -> Sums:
        return self.sync.update_error(measure) if self.sync else {}

    def start(self) -> None:
        if self.sync:
            self.sync.broadcast_parameters()

    def summary(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        if self.sync:
            self.sync.close()


def build_data_parallel(cfg: Config, ctx: DistContext, groups: MeshGroups, data: TensorDataset,
                     rec: Recorder) -> DataParallelEngine:
    """The model from `cfg.train.seed`, an SGD optimiser and, with replicas, `cfg.dp`'s sync."""
    model = seeded_model(cfg, data, ctx)
    optimizer = make_sgd(model, cfg.optim)
    sync = build_reducer(cfg.dp, model, groups.replicas, wire=cfg.wire.grad, ctx=ctx,
                         link=cfg.comm.link, optimizer=optimizer, rec=rec, seed=cfg.train.seed) \
        if groups.replicas.size > 1 else None
    return DataParallelEngine(model, optimizer, groups, sync, rec, task_named(data.task),
                            cfg.wire.grad.codec)
