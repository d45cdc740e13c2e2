"""The record of tensor-parallel training (seed 003's split within a layer and by channel):
every layer the plan names split over the mesh's `tp` axis, replicated over `dp`."""

from __future__ import annotations

from torch import nn

from approxdist.comm.collectives import algorithm_names
from approxdist.config.schema import Config
from approxdist.data import TensorDataset
from approxdist.errors import ConfigError
from approxdist.models import sequence_plan_of
from approxdist.tensor_parallel import check_plan
from approxdist.topology import Mesh
from approxdist.train.engines.tensor import build_tensor, plan_of
from approxdist.train.mode import Mode, Sections, given_mesh, implied_by_mesh, modes, register
from approxdist.train.parts import check_dp, check_wire


def _mesh(cfg: Config) -> Mesh:
    size = cfg.tp.size
    return given_mesh(cfg, modes().get("tensor")) or \
        Mesh.of({"dp": max(1, cfg.train.world_size // size), "tp": size})


def _implied(sections: Sections) -> Sections:
    """The world is tp x dp ranks (`--tp N` alone: one replica)."""
    sections = implied_by_mesh(sections, lambda mesh: {
        "train": {"world_size": mesh.world_size}, "tp": {"size": mesh.extent("tp")}})
    train, tp = sections.setdefault("train", {}), sections.get("tp", {})
    train.setdefault("world_size", tp.get("size", 2))
    return sections


def _check(cfg: Config) -> None:
    size, world = cfg.tp.size, cfg.train.world_size
    if world % size:
        raise ConfigError(f"tp.size = {size} does not divide the world of {world} ranks; the "
                          f"world is tp x replicas: use --world-size {size * max(1, world // size)}"
                          f" or another --tp")
    if cfg.tp.algorithm not in algorithm_names():
        raise ConfigError(f"tp.algorithm = {cfg.tp.algorithm!r} is not one of: "
                          f"{', '.join(algorithm_names())}")
    if cfg.wire.grad.adaptive:
        raise ConfigError(f"wire.grad.codec = {cfg.wire.grad.codec!r}: AdaPrec on tensor "
                          f"parallelism is not built; use a fixed codec")
    for name in ("tp_fwd", "tp_bwd"):
        check_wire(cfg, name)
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
                          f"in the plan and drop tp.sequence_parallel (docs/sp_section.md)")
    if sequence_plan_of(name) is None:
        raise ConfigError(f"tp.sequence_parallel = true splits activations along the sequence, "
                          f"but model {name!r} has none; use a gpt model (--model gpt-tiny) or "
                          f"drop --set tp.sequence_parallel=true")


def _preflight(cfg: Config, model: nn.Module, data: TensorDataset) -> None:
    """The plan against the model: every layer it names, its type, the tp size divides it;
    with sequence parallelism, the sequence length too."""
    check_plan(model, plan_of(cfg, model), cfg.tp.size)
    length, size = data.input_shape[0], cfg.tp.size
    if cfg.tp.sequence_parallel and length % size:
        raise ConfigError(f"tp.sequence_parallel: tp size {size} does not divide the sequence "
                          f"length {length} of {data.name}; use a length it divides (e.g. "
                          f"--set data.seq_len={-(-length // size) * size}) or another --tp")


TENSOR = register(Mode(
    name="tensor", help="tensor parallelism: every layer the plan names split over --tp "
                        "ranks, replicated over the rest (docs/tensor_parallel.md)",
    axes=frozenset({"tp", "dp"}), mesh=_mesh, engine=build_tensor,
    options=("comm.*", "tp.*", "dp.*", "wire.tp_fwd.*", "wire.tp_bwd.*", "wire.grad.*"),
    implied=_implied, check=_check, preflight=_preflight,
    batch_share=lambda cfg: max(1, cfg.train.world_size // cfg.tp.size),
    share_name="number of replicas (world / tp)",
    flag_keys={"fwd_codec": "wire.tp_fwd.codec", "bwd_codec": "wire.tp_bwd.codec",
               "fwd_channel": "wire.tp_fwd.channel", "bwd_channel": "wire.tp_bwd.channel"}))
