"""The mesh's axis names and where one rank sits on them (pure)."""

from __future__ import annotations

from dataclasses import dataclass

#: the axes a mesh may have, in the order they nest (outermost first), with what they mean
AXES: dict[str, str] = {
    "role": "a parameter server's roles: 0 servers, 1 workers",
    "pp": "pipeline stages",
    "dp": "data-parallel replicas (a parameter server's shards or workers)",
    "tp": "tensor-parallel shards of every layer",
}

#: how a place names its index on each axis in messages ("stage 1, replica 0, shard 1")
WORDS = {"pp": "stage", "dp": "replica", "tp": "shard"}
ROLES = ("server", "worker")


@dataclass(frozen=True)
class Place:
    """One rank's coordinates, `(axis, index)` per axis of its mesh."""

    coords: tuple[tuple[str, int], ...]

    def __getitem__(self, axis: str) -> int:
        """The index on `axis` (0 on an axis the mesh lacks)."""
        return dict(self.coords).get(axis, 0)

    @property
    def stage(self) -> int:
        return self["pp"]

    @property
    def replica(self) -> int:
        return self["dp"]

    @property
    def shard(self) -> int:
        return self["tp"]

    @property
    def role(self) -> str | None:
        """"server" or "worker" on a parameter server's mesh, None elsewhere."""
        return ROLES[self["role"]] if "role" in dict(self.coords) else None

    def __str__(self) -> str:
        if self.role is not None:
            return f"{self.role} {self.replica}"
        names = dict(self.coords)
        parts = [f"stage {self.stage}", f"replica {self.replica}"]
        if "tp" in names:
            parts.append(f"shard {self.shard}")
        return ", ".join(parts)
