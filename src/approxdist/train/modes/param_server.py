"""The record of parameter-server training (seed 003): a `role` mesh of servers holding
the parameter shards and workers computing gradients on their share of every batch."""

from __future__ import annotations

from approxdist.config.schema import Config
from approxdist.errors import ConfigError
from approxdist.param_server.modes import parse_mode
from approxdist.topology import Mesh
from approxdist.train.engines.param_server import build_param_server
from approxdist.train.mode import Mode, Sections, given_mesh, implied_by_mesh, register
from approxdist.train.parts import check_ps


def _mesh(cfg: Config) -> Mesh:
    return given_mesh(cfg, PS) or Mesh.roles(cfg.ps.servers, cfg.ps.workers)


def _implied(sections: Sections) -> Sections:
    """The world is servers + workers (1 each unless given)."""
    def from_mesh(mesh: Mesh) -> Sections:
        servers, workers = (mesh.sizes("dp") * 2)[:2] if len(mesh.sizes("dp")) == 1 \
            else mesh.sizes("dp")
        return {"train": {"world_size": mesh.world_size},
                "ps": {"servers": servers, "workers": workers}}

    sections = implied_by_mesh(sections, from_mesh)
    train, ps = sections.setdefault("train", {}), sections.get("ps", {})
    train.setdefault("world_size", ps.get("servers", 1) + ps.get("workers", 1))
    return sections


def _check(cfg: Config) -> None:
    ps, world = cfg.ps, cfg.train.world_size
    if ps.servers + ps.workers != world:
        raise ConfigError(
            f"train.world_size = {world} but --servers {ps.servers} + --workers "
            f"{ps.workers} make {ps.servers + ps.workers} ranks; drop --world-size or "
            f"use --world-size {ps.servers + ps.workers}")
    if cfg.wire.push.adaptive and parse_mode(ps.mode, ps.workers).kind != "sync":
        raise ConfigError(f"wire.push.codec = {cfg.wire.push.codec!r}: AdaPrec speculates from "
                          f"snapshots of every rank between steps, and --ps-mode {ps.mode} "
                          f"keeps pushes in flight across steps; use --ps-mode sync")
    check_ps(cfg)


PS = register(Mode(
    name="ps", help="parameter server: servers hold the parameters, workers compute "
                    "(--servers, --workers; docs/param_server.md)",
    axes=frozenset({"role", "dp"}), mesh=_mesh, engine=build_param_server,
    options=("comm.*", "ps.*", "adaprec.*", "wire.push.*", "wire.pull.*"), implied=_implied,
    check=_check,
    batch_share=lambda cfg: cfg.ps.workers, share_name="number of workers",
    fixed_steps=lambda cfg: "--parallel ps",
    flag_keys={"codec": "wire.push.codec", "error_feedback": "wire.push.error_feedback",
               "codec_rule": "wire.push.rules"},
    spans=lambda mesh: [("role", "dp")]))  # the world: checkpoints are rank 0's
