"""Which global rank is which server or worker: the parameter server's `role` mesh
(`topology.Mesh.roles`: servers first, then workers) laid on a group's ranks, 0..S+W-1 by
default or any ranks named (`approxdist.ParameterServer(servers=[3], workers=[0, 2])`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from approxdist.topology import Mesh


@dataclass(frozen=True)
class Roles:
    """`servers` server ranks followed by `workers` worker ranks: the mesh
    `role=2,dp=S/W` on ranks 0..S+W-1, or on the global ranks in `ranks` (servers, then
    workers) when it is given."""

    servers: int
    workers: int
    ranks: tuple[int, ...] = field(default=())
    mesh: Mesh = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mesh", Mesh.roles(self.servers, self.workers))
        assert not self.ranks or len(set(self.ranks)) == len(self.ranks) == self.world_size, \
            f"ranks {self.ranks} are not {self.world_size} distinct ranks"

    @property
    def world_size(self) -> int:
        return self.mesh.world_size

    def _at(self, position: int) -> int:
        return self.ranks[position] if self.ranks else position

    def _position(self, rank: int) -> int:
        return self.ranks.index(rank) if self.ranks else rank

    def server_rank(self, k: int) -> int:
        return self._at(self.mesh.slot(self.mesh.rank_at(role=0, dp=k)))

    def worker_rank(self, w: int) -> int:
        return self._at(self.mesh.slot(self.mesh.rank_at(role=1, dp=w)))

    def is_server(self, rank: int) -> bool:
        return self.mesh.place(self._position(rank)).role == "server"

    def index(self, rank: int) -> int:
        """Server or worker index of global `rank`."""
        return self.mesh.place(self._position(rank)).replica

    def describe(self, rank: int) -> str:
        """`"server 0 (rank 0)"` / `"worker 1 (rank 2)"`, for messages."""
        return f"{self.mesh.place(self._position(rank))} (rank {rank})"
