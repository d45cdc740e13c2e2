"""Which global rank is which server or worker (pure): servers first, then workers."""

from __future__ import annotations

from dataclasses import dataclass

from approxdist.errors import ConfigError


@dataclass(frozen=True)
class Roles:
    """`servers` server ranks (0..S-1) followed by `workers` worker ranks (S..S+W-1)."""

    servers: int
    workers: int

    def __post_init__(self) -> None:
        if self.servers < 1:
            raise ConfigError(f"--servers {self.servers} must be >= 1 (the ranks holding the "
                              f"parameters); e.g. --servers 1")
        if self.workers < 1:
            raise ConfigError(f"--workers {self.workers} must be >= 1 (the ranks computing "
                              f"gradients); e.g. --workers 2")

    @property
    def world_size(self) -> int:
        return self.servers + self.workers

    def server_rank(self, k: int) -> int:
        return k

    def worker_rank(self, w: int) -> int:
        return self.servers + w

    def is_server(self, rank: int) -> bool:
        return rank < self.servers

    def index(self, rank: int) -> int:
        """Server or worker index of global `rank`."""
        return rank if self.is_server(rank) else rank - self.servers

    def describe(self, rank: int) -> str:
        """`"server 0 (rank 0)"` / `"worker 1 (rank 2)"`, for messages."""
        role = "server" if self.is_server(rank) else "worker"
        return f"{role} {self.index(rank)} (rank {rank})"
