"""Which replica of a stage handles micro-batch m: round robin (PipeDream's 1F1B-RR; seed 002).

A replicated stage's replicas take different micro-batches of the same global batch:
replica `m mod r_s` of stage s handles micro-batch m. With equal replication r this
makes every micro-batch travel along one pipeline row (m mod r is the same at every
stage); with unequal replication (a convolution stage on 3 ranks feeding one
fully-connected stage) a stage with several upstream or downstream replicas sends to and
receives from the one that handles the micro-batch at hand. Pure: the pipeline transport
and the replicated schedules use it to name peers by their *slot* (the position of a rank
in stage-major order, `Topology.slot`).

A rank may hold several stages (*chunks*, the virtual stages of interleaved and
zero-bubble V schedules): `ranks` then names the slot of every chunk, and `Dealing.v(P)` is
ZB-V's placement, rank r holding chunks r and 2P-1-r (`check_v` refuses any other for a V
schedule, naming the fix).
"""

from __future__ import annotations

from dataclasses import dataclass

from approxdist.topology.mesh import Mesh, TopologyError


@dataclass(frozen=True)
class Dealing:
    """Round-robin dealing of micro-batches over the replicas of each stage."""

    replicas: tuple[int, ...]  # replica count per stage
    #: the slot of every stage when a rank holds several (chunks, one replica each); None:
    #: stage-major, each slot one stage
    ranks: tuple[int, ...] | None = None

    @classmethod
    def v(cls, num_ranks: int) -> Dealing:
        """ZB-V's placement: 2P chunks, rank r holding chunks r and 2P-1-r."""
        return cls((1,) * (2 * num_ranks), v_placement(num_ranks))

    @property
    def num_slots(self) -> int:
        return sum(self.replicas) if self.ranks is None else max(self.ranks) + 1

    def stages_of(self, slot: int) -> list[int]:
        """The stages (chunks) the rank at `slot` holds, in order."""
        if self.ranks is None:
            return [self.place(slot)[0]]
        return [c for c, r in enumerate(self.ranks) if r == slot]

    @classmethod
    def of(cls, mesh: Mesh) -> Dealing:
        return cls(mesh.replicas)

    @classmethod
    def single(cls, stages: int) -> Dealing:
        """One replica per stage: every micro-batch stays on the stage's one rank."""
        return cls((1,) * stages)

    def replica(self, stage: int, microbatch: int) -> int:
        """The replica of `stage` that handles `microbatch`."""
        return microbatch % self.replicas[stage]

    def slot(self, stage: int, microbatch: int) -> int:
        """The stage-major position of that replica (its index in the pipeline's group)."""
        if self.ranks is not None:
            return self.ranks[stage]
        return sum(self.replicas[:stage]) + self.replica(stage, microbatch)

    def place(self, slot: int) -> tuple[int, int]:
        """(stage, replica) of the rank at `slot` (its first chunk when it holds several)."""
        if self.ranks is not None:
            return self.stages_of(slot)[0], 0
        first = 0
        for stage, count in enumerate(self.replicas):
            if slot < first + count:
                return stage, slot - first
            first += count
        raise ValueError(f"slot {slot} is outside the {first} slots of replicas {self.replicas}")

    def microbatches(self, stage: int, replica: int, num_microbatches: int) -> list[int]:
        """The micro-batches `replica` of `stage` handles, in order."""
        return list(range(replica, num_microbatches, self.replicas[stage]))


def v_placement(num_ranks: int) -> tuple[int, ...]:
    """The rank of each of 2P chunks in a V: chunk c on rank c, then back up (2P-1-c)."""
    return tuple(range(num_ranks)) + tuple(reversed(range(num_ranks)))


def check_v(ranks: tuple[int, ...], what: str = "zbv") -> None:
    """`TopologyError` unless `ranks` (chunk -> rank) is a V: an even number 2P of chunks,
    rank r holding chunks r and 2P-1-r."""
    if len(ranks) % 2:
        raise TopologyError(f"{what} places two chunks per rank in a V but got {len(ranks)} "
                            f"chunks (an odd number); cut the model into {len(ranks) + 1} "
                            f"or {max(len(ranks) - 1, 2)} chunks (2 per rank)")
    want = v_placement(len(ranks) // 2)
    if tuple(ranks) != want:
        raise TopologyError(f"{what} needs the V placement chunk -> rank "
                            f"{','.join(map(str, want))} (rank r holds chunks r and 2P-1-r) but "
                            f"got {','.join(map(str, ranks))}; use Dealing.v({len(ranks) // 2})")
