"""Replicated stages' messages travel between slots (PipeDream's 1F1B-RR; seed 002): routing
and the on-paper check of a slot-keyed order, flushed or streamed.

`slot_route` names each send's and receive's channel by the slots of the replicas that
handle the micro-batch at both ends (`topology.dealing`); `check_replicated` runs an order
under the executor contract with that routing (`simulate`, where the k-th `AR`s of a
stage's replicas are one all-reduce) and checks FIFO matching on every channel. Used by
the flushed replicated schedules (`replicated`) and the asynchronous ones
(`check_versions`); it imports no schedule registry.
"""

from __future__ import annotations

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule.action import Action, Order
from approxdist.pipeline.schedule.simulate import Route, simulate
from approxdist.topology.dealing import Dealing


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
