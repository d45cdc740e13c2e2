"""What an engine whose model is split by tensor parallelism adds to its own: the split's
bytes, wires, error-feedback residuals (in checkpoints and snapshots), summary and close.

The tensor engine (`tp x dp`) and the pipeline engine (`tp x pp`, each stage split) hold
one; the residuals are per rank (each fed back what its own batches dropped), so a
checkpoint written by a shard's first replica carries every replica's, in replica order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from approxdist.api.tensor_parallel import TensorParallel
from approxdist.config.schema import Config
from approxdist.launch.group import Group
from approxdist.models import sequence_plan_of, tp_plan_of
from approxdist.tensor_parallel import check_plan, default_plan, tp_plan_from
from approxdist.tensor_parallel.reshard import index_table
from approxdist.trace import Recorder


class TPSplit:
    """This rank's split of the model (`tp`), and the replicas that hold the same shard."""

    def __init__(self, tp: TensorParallel, replicas: Group, cfg: Config) -> None:
        self.tp, self.replicas, self.cfg = tp, replicas, cfg

    def link_bytes(self, others: Mapping[str, int]) -> dict[str, int]:
        """`others` with the split's bytes per directed link added."""
        out = dict(self.tp.link_bytes())
        for key, n in others.items():
            out[key] = out.get(key, 0) + n
        return out

    def wires(self) -> dict[str, str]:
        w = self.cfg.wire
        return {"tp_fwd": w.tp_fwd.codec, "tp_bwd": w.tp_bwd.codec}

    def state_dict(self) -> dict[str, Any]:
        """Every replica's residuals in replica order (a collective over the replicas), and
        which entries of the whole model this shard holds (`approxdist evaluate` merges)."""
        return {"tp_feedback": self.replicas.all_gather_object(self.tp.feedback_state()),
                "tp": {"size": self.tp.group.size, "plan": self.tp.plan,
                       "index": index_table(self.tp.shard_index())}}

    def local_state(self) -> dict[str, Any]:
        """This rank's residuals, without collectives (an in-process snapshot)."""
        return {"tp_feedback": self.tp.feedback_state()}

    def load_state_dict(self, state: Mapping[str, Any], local: bool = False) -> None:
        feedback = state.get("tp_feedback", {})
        if not local:
            mine = self.replicas.rank
            feedback = feedback[mine] if mine < len(feedback) else {}
        self.tp.load_feedback_state(feedback)

    def summary(self) -> dict[str, Any]:
        w = self.cfg.wire
        return {"tp": {"size": self.tp.group.size, "layers_split": len(self.tp.plan),
                       "sequence_parallel": self.cfg.tp.sequence_parallel,
                       "fwd_codec": w.tp_fwd.codec, "bwd_codec": w.tp_bwd.codec}}

    def close(self) -> None:
        self.tp.close()


def plan_of(cfg: Config, model: Any) -> dict[str, str]:
    """`tp.plan` (a file or inline), or the model family's own plan (with sequence
    parallelism, `tp.sequence_parallel`, its sequence-parallel one)."""
    if cfg.tp.plan:
        return tp_plan_from(cfg.tp.plan)
    family = sequence_plan_of if cfg.tp.sequence_parallel else tp_plan_of
    return default_plan(model, family(cfg.model.name), cfg.model.name)


def check_split(cfg: Config, model: Any) -> None:
    """The plan against the model before any worker starts: every layer it names, its
    type, and that `tp.size` divides it (nothing to check when nothing is split)."""
    if cfg.tp.size > 1:
        check_plan(model, plan_of(cfg, model), cfg.tp.size)


def split_model(cfg: Config, model: Any, group: Group, replicas: Group,
                rec: Recorder) -> TPSplit:
    """`model` split over `group` (the mesh's `tp` group) as the config says."""
    tp = TensorParallel.from_config(model, tp=cfg.tp, fwd=cfg.wire.tp_fwd, bwd=cfg.wire.tp_bwd,
                                    group=group, plan=plan_of(cfg, model),
                                    link=cfg.comm.link, recorder=rec)
    return TPSplit(tp, replicas, cfg)
