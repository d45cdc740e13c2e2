"""The records of single-process training and data parallelism (seeds 001, 004): the whole
model on every rank of a `dp` mesh, a shard of every global batch each."""

from __future__ import annotations

from approxdist.config.adaprec import candidates_of
from approxdist.config.schema import Config
from approxdist.errors import ConfigError
from approxdist.topology import Mesh
from approxdist.train.engines.replicated import build_replicated
from approxdist.train.mode import Mode, Sections, given_mesh, implied_by_mesh, register
from approxdist.train.parts import check_dp


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
    mesh=lambda cfg: Mesh.single(), engine=build_replicated,
    implied=_single_implied, check=_check_single))


def _dp_mesh(cfg: Config) -> Mesh:
    return given_mesh(cfg, DP) or Mesh.data_parallel(cfg.train.world_size)


def _dp_implied(sections: Sections) -> Sections:
    return implied_by_mesh(sections, lambda mesh: {"train": {"world_size": mesh.world_size}})


def _check_dp(cfg: Config) -> None:
    dp, world = cfg.dp, cfg.train.world_size
    if cfg.comm.link and world > 1 and dp.engine == "plain":
        raise ConfigError(f"comm.link = {cfg.comm.link!r}: the plain dp engine reduces with "
                          f"dist.all_reduce, which the link emulation cannot shape; drop --link "
                          f"or use --dp-engine approxdist")
    if candidates_of(dp.codec) is not None and (world < 2 or dp.engine != "approxdist"
                                                or dp.early_forward):
        raise ConfigError(f"dp.codec = {dp.codec!r}: AdaPrec switches the codecs of a "
                          f"data-parallel run's buckets; use --parallel dp with --world-size "
                          f"2 or more, the approxdist engine and no --early-forward")
    check_dp(cfg)


DP = register(Mode(
    name="dp", help="data parallelism: every rank a replica, gradients all-reduced "
                    "(docs/data_parallel.md)",
    axes=frozenset({"dp"}), mesh=_dp_mesh, engine=build_replicated,
    options=("comm.*", "dp.*", "adaprec.*"), implied=_dp_implied, check=_check_dp))
