"""The `[ps]` config section: parameter-server runs (`--parallel ps`; docs/param_server.md).

`servers` + `workers` ranks (servers first); `mode` is a `--ps-mode` string checked where
the parts are built (`approxdist.train.parts`, `param_server.modes`); how pushes
(gradients) and pulls (parameters) travel is the `push` and `pull` wires'
(`[wire.push]`, `[wire.pull]`, `config/wire.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from approxdist.errors import ConfigError


@dataclass(frozen=True)
class PSConfig:
    """Parameter-server options; see docs/param_server.md."""

    servers: int = 1
    workers: int = 1
    mode: str = "sync"
    staleness_lr: bool = False  # divide the learning rate by a gradient's staleness
    #: go on without a dead worker (async / ssp / backup, local launcher only; checked in
    #: `approxdist.train.check`; docs/param_server.md, "Failures")
    tolerate_worker_loss: bool = False

    def __post_init__(self) -> None:
        if self.servers < 1:
            raise ConfigError(f"ps.servers = {self.servers} must be >= 1; e.g. --servers 1")
        if self.workers < 1:
            raise ConfigError(f"ps.workers = {self.workers} must be >= 1; e.g. --workers 2")
