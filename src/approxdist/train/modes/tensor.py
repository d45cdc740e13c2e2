"""The record of tensor-parallel training (seed 003's split within a layer and by channel):
every layer the plan names split over the mesh's `tp` axis, replicated over `dp`.
(A pipeline's stages split over `tp` are the pipeline and hybrid records', `pipeline.py`.)"""

from __future__ import annotations

from torch import nn

from approxdist.config.schema import Config
from approxdist.data import TensorDataset
from approxdist.errors import ConfigError
from approxdist.models import sequence_plan_of
from approxdist.planner.kinds import plan_kind
from approxdist.topology import Mesh
from approxdist.train.engines.tensor import build_tensor
from approxdist.train.engines.tp_split import check_split
from approxdist.train.mode import Mode, Sections, given_mesh, implied_by_mesh, modes, register
from approxdist.train.parts import check_dp, check_tp, check_wire

#: ranks per split layer when neither --tp nor the mesh says
DEFAULT_TP = 2


def _mesh(cfg: Config) -> Mesh:
    size = cfg.tp.size
    return given_mesh(cfg, modes().get("tensor")) or \
        Mesh.of({"dp": max(1, cfg.train.world_size // size), "tp": size})


def _implied(sections: Sections) -> Sections:
    """The world is tp x dp ranks (`--tp N` alone: one replica; nothing: tp 2)."""
    sections = implied_by_mesh(sections, lambda mesh: {
        "train": {"world_size": mesh.world_size}, "tp": {"size": mesh.extent("tp")}})
    tp = sections.setdefault("tp", {})
    size = tp.setdefault("size", DEFAULT_TP)
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        sections.setdefault("train", {}).setdefault("world_size", size)
    return sections  # a bad size is refused as tp.size (--tp 0), not as a world of 0


def _check(cfg: Config) -> None:
    size, world = cfg.tp.size, cfg.train.world_size
    if size == 1:
        raise ConfigError("tp.size = 1 splits no layer, which is data parallelism; use "
                          "--tp 2 (or more), or --parallel dp")
    if world % size:
        raise ConfigError(f"tp.size = {size} does not divide the world of {world} ranks; the "
                          f"world is tp x replicas: use --world-size {size * max(1, world // size)}"
                          f" or another --tp")
    if cfg.wire.grad.adaptive and (world == size or cfg.dp.reducer != "approxdist"
                                   or cfg.dp.early_forward):
        raise ConfigError(f"wire.grad.codec = {cfg.wire.grad.codec!r}: AdaPrec switches the "
                          f"codecs of the replicas' gradient wire (wire.grad); a tensor-"
                          f"parallel run has one with replicas: use --world-size {2 * size} "
                          f"with --tp {size}, the approxdist engine and no --early-forward")
    check_tp(cfg)
    if cfg.tp.sequence_parallel:
        _check_sequence(cfg)
    if world > size:
        check_dp(cfg)
        check_wire(cfg, "grad")


def _check_sequence(cfg: Config) -> None:
    """Sequence parallelism takes the model's own sequence-parallel plan."""
    name = cfg.model.name
    if cfg.tp.plan:
        raise ConfigError(f"tp.sequence_parallel = true uses the model's own sequence-parallel "
                          f"plan, but tp.plan = {cfg.tp.plan!r} is given; put the _seq styles "
                          f"in the plan and drop tp.sequence_parallel (docs/tensor_parallel.md)")
    if sequence_plan_of(name) is None:
        raise ConfigError(f"tp.sequence_parallel = true splits activations along the sequence, "
                          f"but model {name!r} has none; use a gpt model (--model gpt-tiny) or "
                          f"drop --set tp.sequence_parallel=true")


def _preflight(cfg: Config, model: nn.Module, data: TensorDataset) -> None:
    """The plan against the model: every layer it names, its type, the tp size divides it;
    with sequence parallelism, the sequence length too."""
    check_split(cfg, model)
    length, size = data.input_shape[0], cfg.tp.size
    if cfg.tp.sequence_parallel and length % size:
        raise ConfigError(f"tp.sequence_parallel: tp size {size} does not divide the sequence "
                          f"length {length} of {data.name}; use a length it divides (e.g. "
                          f"--set data.seq_len={-(-length // size) * size}) or another --tp")


TENSOR = register(Mode(
    name="tensor", help="tensor parallelism: every layer the plan names split over --tp "
                        "ranks, replicated over the rest (docs/tensor_parallel.md)",
    axes=frozenset({"tp", "dp"}), mesh=_mesh, engine=build_tensor,
    options=("comm.*", "tp.*", "dp.*", "adaprec.*", "wire.tp_fwd.*", "wire.tp_bwd.*",
             "wire.grad.*"),
    implied=_implied, check=_check, preflight=_preflight,
    batch_share=lambda cfg: max(1, cfg.train.world_size // cfg.tp.size),
    share_name="number of replicas (world / tp)",
    flag_keys={"fwd_codec": "wire.tp_fwd.codec", "bwd_codec": "wire.tp_bwd.codec",
               "fwd_channel": "wire.tp_fwd.channel", "bwd_channel": "wire.tp_bwd.channel"},
    plan=plan_kind("tensor")))
