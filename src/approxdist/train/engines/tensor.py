"""Tensor-parallel training (seed 003's split within a layer and by channel), composed with
data parallelism on a `tp x dp` mesh.

A thin adapter over the public `approxdist.TensorParallel` (built with `from_config` on
the mesh's `tp` group) inside the data-parallel engine: every rank of a `tp` group takes
the same shard of each global batch (its replica's), the split layers' collectives run
on the `tp_fwd` / `tp_bwd` wires, and with several replicas the shards' gradients are
averaged over the `dp` group by the replicas' reducer on the `grad` wire (each rank with
the replicas of its own shard). Checkpoints hold each shard's parameters, optimiser
state and wire residuals, one directory per shard (`train/resume.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from approxdist.config.schema import Config
from approxdist.data import TensorDataset
from approxdist.data_parallel.replicas import ReplicaReducer, build_reducer
from approxdist.launch.context import DistContext
from approxdist.topology.groups import MeshGroups
from approxdist.trace import Recorder
from approxdist.train.engine import seeded_model
from approxdist.train.engines.data_parallel import DataParallelEngine
from approxdist.train.engines.tp_split import TPSplit, split_model
from approxdist.train.optim import make_sgd
from approxdist.train.task import Task, task_named


class TensorParallelEngine(DataParallelEngine):
    """This rank's shard of the model (`tp`), averaged over its replicas (`sync`, `dp`)."""

    def __init__(self, split: TPSplit, groups: MeshGroups, sync: ReplicaReducer | None,
                 rec: Recorder, task: Task, cfg: Config) -> None:
        super().__init__(split.tp, make_sgd(split.tp, cfg.optim), groups, sync, rec, task,
                         cfg.wire.grad.codec)
        self.split = split

    def link_bytes(self) -> dict[str, int]:
        return self.split.link_bytes(super().link_bytes())

    def wires(self) -> dict[str, str]:
        return {**self.split.wires(), **super().wires()}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **self.split.state_dict()}

    def local_state(self) -> dict[str, Any]:
        return {**super().local_state(), **self.split.local_state()}

    def load_state_dict(self, state: Mapping[str, Any], local: bool = False) -> None:
        super().load_state_dict(state, local)
        self.split.load_state_dict(state, local)

    def summary(self) -> dict[str, Any]:
        return self.split.summary()

    def close(self) -> None:
        super().close()
        self.split.close()


def build_tensor(cfg: Config, ctx: DistContext, groups: MeshGroups, data: TensorDataset,
                 rec: Recorder) -> TensorParallelEngine:
    """Every rank builds the whole model from the same seed and keeps its shard."""
    model = seeded_model(cfg, data, ctx)
    split = split_model(cfg, model, groups["tp"], groups["dp"], rec)
    sync = build_reducer(cfg.dp, split.tp, groups["dp"], wire=cfg.wire.grad, ctx=ctx,
                         link=cfg.comm.link, rec=rec, seed=cfg.train.seed) \
        if groups["dp"].size > 1 else None
    return TensorParallelEngine(split, groups, sync, rec, task_named(data.task), cfg)
