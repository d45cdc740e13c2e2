"""`approxdist.TensorParallel`: a user's own model split within its layers (Megatron-LM's
tensor parallelism; seed 003's split within a layer and by channel).

Every rank of the group builds the same model (the same weights from the same seed) and
wraps it; each keeps its part of every layer the plan names and computes the rest whole.
The collectives cross approxdist's link layer on two wires, so every codec, bit-error
channel, emulated link, byte count and trace applies to tensor parallelism:

    dist.init_process_group("gloo")
    plan = approxdist.models.tp_plan_of("gpt-tiny")(gpt_model)  # or {"1.mlp.0": "colwise", ...}
    model = approxdist.TensorParallel(gpt_model, plan=plan, fwd_codec="bf16")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:                 # every rank of the group takes the same batch
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(); loss.backward(); opt.step()

A plan maps a layer's path to a style (`colwise`, `rowwise`, `heads`, `channel_out`,
`channel_in`, `channel_norm`; `tensor_parallel.plan`), as torch's `parallelize_module`
takes one; a model family of approxdist has its own (`approxdist.models.tp_plan_of`).
Sequence parallelism is a plan too: `approxdist.models.sequence_plan_of("gpt-tiny")(model)`,
or the `_seq` styles in a plan of one's own (norms and dropout on each rank's positions).
`fwd_codec`/`fwd_channel` are the wire of the forward collectives (a row-parallel
layer's partial sums), `bwd_codec`/`bwd_channel` the backward ones (a column-parallel
layer's input gradients); `error_feedback` keeps residuals on the lossy ones. Data
parallelism composes: `DataParallel(TensorParallel(model, group=tp), group=dp)`. The
parameters are this rank's shards: `state_dict()` saves them with the wires' residuals
under `"tp_feedback"`, `shard_index()` says which entries of the whole each holds.
`approxdist train --parallel tensor` runs this class (`TensorParallel.from_config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from approxdist.comm.link import Link
from approxdist.comm.netem import parse_link
from approxdist.config.tp import TPConfig
from approxdist.config.wire import Wire
from approxdist.data_parallel.checks import context_of
from approxdist.errors import ConfigError, SpecError
from approxdist.launch.group import Group, world_group
from approxdist.tensor_parallel import TPComm, parallelize, tp_plan_from
from approxdist.tensor_parallel.layers import Index, shard_index
from approxdist.trace.recorder import NULL_RECORDER, Recorder

PlanArg = Mapping[str, str] | str | Path


class TensorParallel(nn.Module):
    """`model` split over `group` by `plan`; calls run the split model."""

    def __init__(self, model: nn.Module, *, plan: PlanArg, group: Group | None = None,
                 fwd_codec: str = "fp32", bwd_codec: str = "fp32", fwd_channel: str = "",
                 bwd_channel: str = "", error_feedback: bool = False, link: str = "",
                 algorithm: str = "auto", recorder: Recorder | None = None) -> None:
        super().__init__()
        ctx = context_of(model)
        if not ctx.distributed:
            raise ConfigError("approxdist.TensorParallel needs torch.distributed: call "
                              "dist.init_process_group(...) on every rank first (e.g. under "
                              "torchrun), the ranks of one group splitting each layer")
        fwd = Wire(codec=fwd_codec, channel=fwd_channel, error_feedback=error_feedback)
        bwd = Wire(codec=bwd_codec, channel=bwd_channel, error_feedback=error_feedback)
        try:
            shaping = parse_link(link) if link else None
        except SpecError as exc:
            raise ConfigError(f"link={link!r}: {exc}") from None
        self._assemble(model, group or world_group(ctx), plan, fwd, bwd, shaping, algorithm,
                       recorder or NULL_RECORDER)

    @classmethod
    def from_config(cls, model: nn.Module, *, tp: TPConfig, fwd: Wire, bwd: Wire, group: Group,
                    plan: Mapping[str, str], link: str = "",
                    recorder: Recorder = NULL_RECORDER) -> TensorParallel:
        """The split a checked config describes on the mesh's `tp` group (the trainer's
        engine builds it so; `approxdist.train.check` checked the sections and the plan)."""
        obj = cls.__new__(cls)
        nn.Module.__init__(obj)
        obj._assemble(model, group, plan, fwd, bwd, parse_link(link) if link else None,
                      tp.algorithm, recorder)
        return obj

    def _assemble(self, model: nn.Module, group: Group, plan: PlanArg, fwd: Wire, bwd: Wire,
                  shaping: Any, algorithm: str, recorder: Recorder) -> None:
        ctx = context_of(model)
        layers = tp_plan_from(str(plan)) if isinstance(plan, (str, Path)) else dict(plan)
        self.comm = TPComm(Link(ctx, shaping, hook=recorder.transfer_hook("tp"), group=group),
                           fwd, bwd, algorithm)
        self.module = parallelize(model, layers, self.comm)
        self.plan = layers

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @property
    def group(self) -> Group:
        return self.comm.link.group

    def shard_index(self) -> dict[str, tuple[int, Index]]:
        """Every split parameter's name (as in `state_dict`) -> (the dimension split, this
        rank's index of the whole along it)."""
        return {f"module.{k}": v for k, v in shard_index(self.module).items()}

    def link_bytes(self) -> dict[str, int]:
        """Bytes this rank sent so far per directed link `"i->j"`."""
        return self.comm.link_bytes()

    def feedback_state(self) -> dict[str, Any]:
        """The wires' error-feedback residuals per site (empty without feedback)."""
        return self.comm.state_dict()

    def load_feedback_state(self, state: Mapping[str, Any]) -> None:
        self.comm.load_state_dict(state)

    def close(self) -> None:
        """Release the link (call once, after training)."""
        self.comm.close()
