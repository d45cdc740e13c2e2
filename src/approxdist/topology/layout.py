"""Ranks -> (stage, replica): the one topology every parallel mode runs on (pure; seed 002).

A topology lists, for each pipeline stage, the global ranks of its replicas. Pure data
parallelism is one stage with every rank a replica; a pipeline is one replica per stage
(placed on any ranks, like torch.distributed.pipelining's `stage_index_to_group_rank`);
PipeDream's hybrid runs replicate stages, equally (a PP x DP grid) or not (seed 002's
AlexNet: a convolution stage on 3 ranks feeding one fully-connected stage). From it each
rank learns its place and the groups it talks in: its stage's replicas (gradient
averaging), its upstream and downstream peers (activations and gradients, which travel
in the pipeline group of every rank in stage-major order, between the replicas that
`topology.dealing` names), and the world. No torch.distributed here:
`topology.groups.make_groups` turns the groups into process groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from approxdist.errors import ConfigError


class TopologyError(ConfigError):
    """A topology or placement that cannot be: ranks missing or repeated, empty stages."""


@dataclass(frozen=True)
class Place:
    """Where one rank sits: its stage and its index among that stage's replicas."""

    stage: int
    replica: int

    def __str__(self) -> str:
        return f"stage {self.stage}, replica {self.replica}"


@dataclass(frozen=True)
class GroupSpec:
    """A sub-group to create: a name and its global ranks in member order."""

    name: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class RankGroups:
    """The ranks one rank talks with, each tuple in member order (pure data)."""

    rank: int
    place: Place
    replicas: tuple[int, ...]           # this stage's replicas (gradient averaging)
    upstream: tuple[int, ...]           # every replica of the previous stage
    downstream: tuple[int, ...]         # every replica of the next stage
    pipeline: tuple[int, ...] | None    # this rank's pipeline row (equal replication only)
    world: tuple[int, ...]


@dataclass(frozen=True)
class Topology:
    """`stages[s]` = the global ranks of stage s's replicas, in replica order."""

    stages: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not self.stages:
            raise TopologyError("a topology needs at least one stage")
        for s, ranks in enumerate(self.stages):
            if not ranks:
                raise TopologyError(f"stage {s} has 0 replicas; every stage needs at least one "
                                    f"rank (e.g. --replicas 2,1)")
        _check_cover([r for ranks in self.stages for r in ranks], "topology")

    # -- constructors ----------------------------------------------------------------------
    @classmethod
    def grid(cls, stages: int, replicas: int | Sequence[int] = 1,
             placement: Sequence[int] | None = None) -> Topology:
        """`stages` stages with `replicas` ranks each (one count, or one per stage).

        Ranks are placed stage by stage, replicas of a stage next to each other (they
        exchange the most bytes): `placement` lists the global ranks in that order, by
        default 0, 1, 2, ...; `grid(3, placement=[2, 0, 3, 1])` is invalid (4 ranks for
        3 slots), `grid(3, placement=[2, 0, 1])` puts stage 0 on rank 2.
        """
        counts = replica_counts(stages, replicas)
        slots = sum(counts)
        order = list(range(slots)) if placement is None else [int(r) for r in placement]
        if len(order) != slots:
            raise TopologyError(
                f"placement {list(order)} names {len(order)} ranks but {stages} stage(s) with "
                f"replicas {','.join(map(str, counts))} need {slots}; give one rank per slot, "
                f"stage 0's replicas first")
        _check_cover(order, "placement")
        out, at = [], 0
        for n in counts:
            out.append(tuple(order[at:at + n]))
            at += n
        return cls(tuple(out))

    @classmethod
    def single(cls) -> Topology:
        return cls(((0,),))

    @classmethod
    def data_parallel(cls, world_size: int) -> Topology:
        """One stage, every rank a replica."""
        return cls.grid(1, world_size)

    @classmethod
    def pipeline(cls, stages: int, placement: Sequence[int] | None = None) -> Topology:
        """One replica per stage; stage s on `placement[s]` (default rank s)."""
        return cls.grid(stages, 1, placement)

    # -- shape -------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return sum(len(r) for r in self.stages)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def replicas(self) -> tuple[int, ...]:
        """Replica count per stage."""
        return tuple(len(r) for r in self.stages)

    @property
    def equal(self) -> bool:
        """Every stage has the same number of replicas (a PP x DP grid)."""
        return len(set(self.replicas)) == 1

    @property
    def kind(self) -> str:
        """"single", "data-parallel", "pipeline" or "hybrid"."""
        if self.num_stages == 1:
            return "single" if self.world_size == 1 else "data-parallel"
        return "pipeline" if max(self.replicas) == 1 else "hybrid"

    # -- places and groups ---------------------------------------------------------------------
    def place(self, rank: int) -> Place:
        for s, ranks in enumerate(self.stages):
            if rank in ranks:
                return Place(s, ranks.index(rank))
        raise TopologyError(f"rank {rank} is not in this topology of {self.world_size} ranks "
                            f"(0..{self.world_size - 1})")

    def slot(self, rank: int) -> int:
        """`rank`'s position in stage-major order (stage 0's replicas first): what seeds
        per-rank randomness, so a run's numbers do not depend on its placement."""
        p = self.place(rank)
        return sum(self.replicas[:p.stage]) + p.replica

    def describe_rank(self, rank: int) -> str:
        """`"rank 3 (stage 1, replica 0)"`, for messages."""
        return f"rank {rank} ({self.place(rank)})"

    def pipelines(self) -> list[tuple[int, ...]]:
        """With equal replication, row j = replica j of every stage, in stage order."""
        if not self.equal:
            raise TopologyError(f"replicas {','.join(map(str, self.replicas))} differ between "
                                f"stages, so ranks do not form pipeline rows; stages talk to "
                                f"every replica of their neighbours instead (round robin)")
        return [tuple(ranks[j] for ranks in self.stages) for j in range(self.replicas[0])]

    def groups_of(self, rank: int) -> RankGroups:
        p = self.place(rank)
        row = self.pipelines()[p.replica] if self.equal else None
        up = self.stages[p.stage - 1] if p.stage > 0 else ()
        down = self.stages[p.stage + 1] if p.stage + 1 < self.num_stages else ()
        return RankGroups(rank, p, self.stages[p.stage], up, down, row,
                          tuple(range(self.world_size)))

    def group_specs(self) -> list[GroupSpec]:
        """Every sub-group of more than one rank, in the order all ranks create them: each
        stage's replicas, then (several stages) the pipeline: every rank in stage-major
        order, so that a rank's index in it is its `slot` (activations and gradients travel
        there, between the replicas `topology.dealing` names)."""
        specs = [GroupSpec(f"stage {s} replicas", ranks)
                 for s, ranks in enumerate(self.stages) if len(ranks) > 1]
        if self.num_stages > 1:
            specs.append(GroupSpec("pipeline", tuple(r for ranks in self.stages for r in ranks)))
        return specs


def replica_counts(stages: int, replicas: int | Sequence[int]) -> tuple[int, ...]:
    """One replica count per stage from one number or a list; `TopologyError` if impossible."""
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise TopologyError(f"stages ({stages!r}) must be an integer >= 1")
    counts = (replicas,) * stages if isinstance(replicas, int) else tuple(replicas)
    if len(counts) != stages:
        raise TopologyError(f"replicas {','.join(map(str, counts))} give {len(counts)} counts for "
                            f"{stages} stages; give one count per stage or one for all")
    for s, n in enumerate(counts):
        if not isinstance(n, int) or n < 1:
            raise TopologyError(f"stage {s} has {n} replicas; every stage needs at least one "
                                f"rank (e.g. --replicas 2,1)")
    return counts


def _check_cover(ranks: list[int], what: str) -> None:
    """`ranks` must be 0..n-1, each exactly once."""
    n = len(ranks)
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    outside = sorted({r for r in ranks if not 0 <= r < n})
    missing = sorted(set(range(n)) - set(ranks))
    if not (twice or outside or missing):
        return
    problems = []
    if twice:
        problems.append(f"rank(s) {', '.join(map(str, twice))} more than once")
    if outside:
        problems.append(f"rank(s) {', '.join(map(str, outside))} outside 0..{n - 1}")
    if missing:
        problems.append(f"rank(s) {', '.join(map(str, missing))} nowhere")
    raise TopologyError(f"{what} {ranks} must name every rank of a world of {n} (0..{n - 1}) "
                        f"exactly once, but has {'; '.join(problems)}")
