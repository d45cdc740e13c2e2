"""Which replica of a stage handles micro-batch m: round robin (PipeDream's 1F1B-RR; seed 002).

A replicated stage's replicas take different micro-batches of the same global batch:
replica `m mod r_s` of stage s handles micro-batch m. With equal replication r this
makes every micro-batch travel along one pipeline row (m mod r is the same at every
stage); with unequal replication (a convolution stage on 3 ranks feeding one
fully-connected stage) a stage with several upstream or downstream replicas sends to and
receives from the one that handles the micro-batch at hand. Pure: the pipeline transport
and the replicated schedules use it to name peers by their *slot* (the position of a rank
in stage-major order, `Topology.slot`).
"""

from __future__ import annotations

from dataclasses import dataclass

from approxdist.topology.mesh import Mesh


@dataclass(frozen=True)
class Dealing:
    """Round-robin dealing of micro-batches over the replicas of each stage."""

    replicas: tuple[int, ...]  # replica count per stage

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
        return sum(self.replicas[:stage]) + self.replica(stage, microbatch)

    def place(self, slot: int) -> tuple[int, int]:
        """(stage, replica) of the rank at `slot`."""
        first = 0
        for stage, count in enumerate(self.replicas):
            if slot < first + count:
                return stage, slot - first
            first += count
        raise ValueError(f"slot {slot} is outside the {first} slots of replicas {self.replicas}")

    def microbatches(self, stage: int, replica: int, num_microbatches: int) -> list[int]:
        """The micro-batches `replica` of `stage` handles, in order."""
        return list(range(replica, num_microbatches, self.replicas[stage]))
