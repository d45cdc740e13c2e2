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
from approxdist.pipeline.schedule.action import Action, Kind, Order
from approxdist.pipeline.schedule.registry import build_schedule
from approxdist.pipeline.schedule.simulate import Route, simulate
from approxdist.topology.dealing import Dealing


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
            backwards = [a.microbatch for a in mine if a.kind is Kind.BACKWARD]
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


def slot_route(dealing: Dealing) -> Route:
    """Messages travel between slots: the replica that handles the micro-batch at each end."""
    def channel(slot: int, a: Action) -> tuple[int, int]:
        peer = dealing.slot(a.peer_stage, a.microbatch)
        return (slot, peer) if a.is_send else (peer, slot)

    return channel


def check_replicated(order: Order, dealing: Dealing) -> None:
    """Run `order` on paper with messages routed between slots; `ScheduleError` naming where
    ranks block if it deadlocks or a receive would get another micro-batch's data."""
    channel = slot_route(dealing)
    timeline = simulate(order, len(dealing.replicas), route=channel)
    if not timeline.completed:
        waits = "; ".join(f"slot {r} blocked at {a} waiting for {timeline.waiting_for[r]}"
                          for r, a in sorted(timeline.stuck.items()))
        raise ScheduleError(f"invalid replicated schedule: deadlock: {waits}",
                            stuck=timeline.stuck)
    _check_fifo(order, channel)


def _check_fifo(order: Order, channel: Route) -> None:
    sends: dict[tuple[int, int], list[Action]] = {}
    recvs: dict[tuple[int, int], list[Action]] = {}
    for slot, actions in sorted(order.items()):
        for a in actions:
            if a.is_send or a.is_recv:
                key = channel(slot, a)
                (sends if a.is_send else recvs).setdefault(key, []).append(a)
    for key, posted in recvs.items():
        for k, (recv, send) in enumerate(zip(posted, sends.get(key, []))):
            if recv.microbatch != send.microbatch:
                raise ScheduleError(f"invalid replicated schedule: on channel {key} receive "
                                    f"#{k} {recv} would get the data of {send}")
