"""Which global rank is which server or worker (pure): servers first, then workers, on
ranks 0..S+W-1 by default or on any ranks named (`approxdist.ParameterServer`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from approxdist.errors import ConfigError


@dataclass(frozen=True)
class Roles:
    """`servers` server ranks (0..S-1) followed by `workers` worker ranks (S..S+W-1), or
    the global ranks of the servers then the workers in `ranks` when it is given."""

    servers: int
    workers: int
    ranks: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.servers < 1:
            raise ConfigError(f"--servers {self.servers} must be >= 1 (the ranks holding the "
                              f"parameters); e.g. --servers 1")
        if self.workers < 1:
            raise ConfigError(f"--workers {self.workers} must be >= 1 (the ranks computing "
                              f"gradients); e.g. --workers 2")
        assert not self.ranks or len(set(self.ranks)) == len(self.ranks) == self.world_size, \
            f"ranks {self.ranks} are not {self.world_size} distinct ranks"

    @property
    def world_size(self) -> int:
        return self.servers + self.workers

    def _at(self, position: int) -> int:
        return self.ranks[position] if self.ranks else position

    def _position(self, rank: int) -> int:
        return self.ranks.index(rank) if self.ranks else rank

    def server_rank(self, k: int) -> int:
        return self._at(k)

    def worker_rank(self, w: int) -> int:
        return self._at(self.servers + w)

    def is_server(self, rank: int) -> bool:
        return self._position(rank) < self.servers

    def index(self, rank: int) -> int:
        """Server or worker index of global `rank`."""
        at = self._position(rank)
        return at if at < self.servers else at - self.servers

    def describe(self, rank: int) -> str:
        """`"server 0 (rank 0)"` / `"worker 1 (rank 2)"`, for messages."""
        role = "server" if self.is_server(rank) else "worker"
        return f"{role} {self.index(rank)} (rank {rank})"
