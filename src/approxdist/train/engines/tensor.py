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

from approxdist.api.tensor_parallel import TensorParallel
from approxdist.config.schema import Config
from approxdist.data import TensorDataset
from approxdist.data_parallel.replicas import ReplicaReducer, build_reducer
from approxdist.launch.context import DistContext
from approxdist.models import sequence_plan_of, tp_plan_of
from approxdist.tensor_parallel import default_plan, tp_plan_from
from approxdist.topology.groups import MeshGroups
from approxdist.trace import Recorder
from approxdist.train.engine import seeded_model
from approxdist.train.engines.data_parallel import DataParallelEngine
from approxdist.train.optim import make_sgd
from approxdist.train.task import Task, task_named


class TensorParallelEngine(DataParallelEngine):
    """This rank's shard of the model (`tp`), averaged over its replicas (`sync`, `dp`)."""

    def __init__(self, tp: TensorParallel, groups: MeshGroups, sync: ReplicaReducer | None,
                 rec: Recorder, task: Task, cfg: Config) -> None:
        super().__init__(tp, make_sgd(tp, cfg.optim), groups, sync, rec, task,
                         cfg.wire.grad.codec)
        self.tp, self.cfg, self.replicas = tp, cfg, groups["dp"]

    def link_bytes(self) -> dict[str, int]:
        out = dict(self.tp.link_bytes())
        for key, n in super().link_bytes().items():
            out[key] = out.get(key, 0) + n
        return out

    def wires(self) -> dict[str, str]:
        w = self.cfg.wire
        return {"tp_fwd": w.tp_fwd.codec, "tp_bwd": w.tp_bwd.codec, **super().wires()}

    def state_dict(self) -> dict[str, Any]:
        """The shard's state, with every replica's tp-wire residuals in replica order (a
        collective over the replicas: each fed back what its own batches dropped)."""
        feedback = self.replicas.all_gather_object(self.tp.feedback_state())
        return {**super().state_dict(), "tp_feedback": feedback,
                "tp": {"size": self.tp.group.size, "plan": self.tp.plan}}

    def local_state(self) -> dict[str, Any]:
        return {**super().local_state(), "tp_feedback": self.tp.feedback_state()}

    def load_state_dict(self, state: Mapping[str, Any], local: bool = False) -> None:
        super().load_state_dict(state, local)
        feedback = state.get("tp_feedback", {})
        if not local:
            replica = self.replicas.rank
            feedback = feedback[replica] if replica < len(feedback) else {}
        self.tp.load_feedback_state(feedback)

    def summary(self) -> dict[str, Any]:
        return {"tp": {"size": self.tp.group.size, "layers_split": len(self.tp.plan),
                       "sequence_parallel": self.cfg.tp.sequence_parallel,
                       "fwd_codec": self.cfg.wire.tp_fwd.codec,
                       "bwd_codec": self.cfg.wire.tp_bwd.codec}}

    def close(self) -> None:
        super().close()
        self.tp.close()


def plan_of(cfg: Config, model: Any) -> dict[str, str]:
    """`tp.plan` (a file or inline), or the model family's own plan (with sequence
    parallelism, `tp.sequence_parallel`, its sequence-parallel one)."""
    if cfg.tp.plan:
        return tp_plan_from(cfg.tp.plan)
    family = sequence_plan_of if cfg.tp.sequence_parallel else tp_plan_of
    return default_plan(model, family(cfg.model.name), cfg.model.name)


def build_tensor(cfg: Config, ctx: DistContext, groups: MeshGroups, data: TensorDataset,
                 rec: Recorder) -> TensorParallelEngine:
    """Every rank builds the whole model from the same seed and keeps its shard."""
    model = seeded_model(cfg, data, ctx)
    tp = TensorParallel.from_config(model, tp=cfg.tp, fwd=cfg.wire.tp_fwd, bwd=cfg.wire.tp_bwd,
                                    group=groups["tp"], plan=plan_of(cfg, model),
                                    link=cfg.comm.link, recorder=rec)
    sync = build_reducer(cfg.dp, tp, groups["dp"], wire=cfg.wire.grad, ctx=ctx,
                         link=cfg.comm.link, rec=rec) if groups["dp"].size > 1 else None
    return TensorParallelEngine(tp, groups, sync, rec, task_named(data.task), cfg)
