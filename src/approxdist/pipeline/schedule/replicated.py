"""Schedules of replicated stages: a pipeline schedule dealt round robin over each stage's
replicas, closed by the gradient all-reduce (PipeDream's 1F1B-RR with flush; seed 002),
the schedules of hybrid parallelism.

    order = replicated_schedule("1f1b", Dealing((3, 1)), num_microbatches=6)
    order[slot]   # the actions of the rank at `slot` (stage-major position), in order

Each stage runs the base schedule's order (`pipeline.schedule`) for all M micro-batches,
but stage s's actions for micro-batch m run on replica m mod r_s (`topology.dealing`);
every replica of a stage with several ends with `AR` (`sAR<m>`, m its last micro-batch),
which waits for the all-reduce of the stage's gradients over its replicas (started during
that last backward). Splitting one stage's list into parallel sub-lists keeps each
replica's actions in the base order, so the base schedule's message order and freedom
from deadlock carry over; `check_replicated` proves it for the schedule at hand by
running it on paper with messages routed between slots.
"""

from __future__ import annotations

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule.action import RELEASES, Action, Kind, Order
from approxdist.pipeline.schedule.registry import build_schedule
from approxdist.pipeline.schedule.routes import check_replicated, slot_route
from approxdist.topology.dealing import Dealing

__all__ = ["check_dealing", "check_replicated", "replicated_schedule", "slot_route"]


def replicated_schedule(name: str, dealing: Dealing, num_microbatches: int) -> Order:
    """Slot -> actions of schedule `name` with stages replicated as `dealing` says.

    With fewer micro-batches than a stage has replicas (a small evaluation batch) some
    replicas get none and an empty list; a training step needs one each
    (`check_dealing`)."""
    stages = len(dealing.replicas)
    base = build_schedule(name, stages, num_microbatches)
    order: Order = {}
    for s, count in enumerate(dealing.replicas):
        for replica in range(count):
            mine = [a for a in base[s] if dealing.replica(s, a.microbatch) == replica]
            backwards = [a.microbatch for a in mine if a.kind in RELEASES]
            if count > 1 and backwards:
                mine.append(Action(s, Kind.ALL_REDUCE, backwards[-1]))
            order[sum(dealing.replicas[:s]) + replica] = mine
    check_replicated(order, dealing)
    return order


def check_dealing(dealing: Dealing, num_microbatches: int) -> None:
    """Every replica must get at least one micro-batch."""
    most = max(dealing.replicas)
    if num_microbatches < most:
        raise ScheduleError(f"micro-batches ({num_microbatches}) must be at least the largest "
                            f"replica count ({most}) so that every replica gets one; use "
                            f"{most} or a multiple of it")
