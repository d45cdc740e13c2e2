"""The records of single-process training and data parallelism (seeds 001, 004): the whole
model on every rank of a `dp` mesh, a shard of every global batch each."""

from __future__ import annotations

from dataclasses import fields

from torch import nn

from approxdist.config.schema import Config
from approxdist.config.wire import Wire
from approxdist.data import TensorDataset
from approxdist.errors import ConfigError
from approxdist.planner.kinds import plan_kind
from approxdist.topology import Mesh
from approxdist.train.engines.data_parallel import build_data_parallel
from approxdist.train.mode import Mode, Sections, given_mesh, implied_by_mesh, register
from approxdist.train.parts import check_dp, check_grad_shapes, check_rules_match, check_wire


def _single_implied(sections: Sections) -> Sections:
    train = sections.setdefault("train", {})
    train.setdefault("world_size", 1)
    return sections


def _check_single(cfg: Config) -> None:
    if cfg.train.world_size != 1:
        raise ConfigError(f"train.world_size = {cfg.train.world_size} with parallel 'single'; "
                          f"use --world-size 1 or --parallel dp")


SINGLE = register(Mode(
    name="single", help="one process, no communication", axes=frozenset({"dp"}),
    mesh=lambda cfg: Mesh.single(), engine=build_data_parallel,
    implied=_single_implied, check=_check_single, plan=plan_kind("single")))


def _dp_mesh(cfg: Config) -> Mesh:
    return given_mesh(cfg, DP) or Mesh.data_parallel(cfg.train.world_size)


def _dp_implied(sections: Sections) -> Sections:
    return implied_by_mesh(sections, lambda mesh: {"train": {"world_size": mesh.world_size}})


def _check_dp(cfg: Config) -> None:
    dp, grad, world = cfg.dp, cfg.wire.grad, cfg.train.world_size
    if dp.reducer == "plain":
        _check_plain(cfg)
    if grad.adaptive and (world < 2 or dp.reducer != "approxdist" or dp.early_forward):
        raise ConfigError(f"wire.grad.codec = {grad.codec!r}: AdaPrec switches the codecs of a "
                          f"data-parallel run's buckets; use --parallel dp with --world-size "
                          f"2 or more, the approxdist engine and no --early-forward")
    check_dp(cfg)
    check_wire(cfg, "grad", per_parameter=True)


def _check_plain(cfg: Config) -> None:
    """The plain baseline is one `dist.all_reduce` of fp32 gradients, nothing else."""
    if cfg.comm.link and cfg.train.world_size > 1:
        raise ConfigError(f"comm.link = {cfg.comm.link!r}: the plain dp reducer reduces with "
                          f"dist.all_reduce, which the link emulation cannot shape; drop --link "
                          f"or use --dp-reducer approxdist")
    changed = [f"wire.grad.{f.name}" for f in fields(Wire)
               if getattr(cfg.wire.grad, f.name) != getattr(Wire(), f.name)]
    if changed:
        raise ConfigError(f"dp.reducer = 'plain' takes none of {', '.join(changed)}: it sends "
                          f"fp32 through dist.all_reduce; use dp.reducer = 'approxdist' "
                          f"(--dp-reducer approxdist)")


def _preflight(cfg: Config, model: nn.Module, data: TensorDataset) -> None:
    """Every per-parameter rule names a parameter of the model, which a compressor on the
    gradient wire can take."""
    check_rules_match(cfg, model)
    check_grad_shapes(cfg, model)


DP = register(Mode(
    name="dp", help="data parallelism: every rank a replica, gradients all-reduced "
                    "(docs/data_parallel.md)",
    axes=frozenset({"dp"}), mesh=_dp_mesh, engine=build_data_parallel,
    options=("comm.*", "dp.*", "adaprec.*", "wire.grad.*"), implied=_dp_implied,
    check=_check_dp, preflight=_preflight, plan=plan_kind("dp")))
