"""The agreed message order of two ranks (impl-SRA's precomputed send/receive order)."""

from __future__ import annotations

import pytest

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule import Action, Kind, Order
from approxdist.pipeline.schedule.exchange import directions, exchange_order
from approxdist.pipeline.schedule.replicated import replicated_schedule, slot_route
from approxdist.topology.dealing import Dealing

Message = tuple[tuple[int, int], int]  # (channel, k-th on it)

PLANS = [((1, 1, 1, 1), m) for m in (1, 3, 8)] + [((1, 1), 5), ((1, 1, 1), 7), ((3, 1), 6),
                                                   ((3, 1), 4), ((1, 2, 1), 8), ((2, 2), 8),
                                                   ((1, 3), 6)]


def _index(order: Order, dealing: Dealing) -> tuple[dict[Message, int], dict[Message, int]]:
    """Where each message is sent (index of the send in its sender's list) and where it is
    consumed (index of the forward / backward that needs it in its receiver's list)."""
    route = slot_route(dealing)
    sent: dict[Message, int] = {}
    used: dict[Message, int] = {}
    counts: dict[tuple[str, tuple[int, int]], int] = {}
    for r, actions in order.items():
        for i, a in enumerate(actions):
            if not (a.is_send or a.is_recv):
                continue
            channel = route(r, a)
            side = "send" if a.is_send else "recv"
            k = counts.get((side, channel), 0)
            counts[(side, channel)] = k + 1
            if a.is_send:
                sent[(channel, k)] = i
            else:
                used[(channel, k)] = actions.index(a.compute())
    return sent, used


@pytest.mark.parametrize("replicas,microbatches", PLANS)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_no_message_is_ordered_before_one_its_sender_needs_first(
        schedule: str, replicas: tuple[int, ...], microbatches: int) -> None:
    """If u comes before v between two ranks, u's sender must not need v before sending u:
    otherwise one thread per peer (posting and waiting in the agreed order) deadlocks."""
    dealing = Dealing(replicas)
    order = replicated_schedule(schedule, dealing, microbatches)
    pairs = exchange_order(order, slot_route(dealing), len(replicas))
    sent, used = _index(order, dealing)
    for channels in pairs.values():
        seen: dict[tuple[int, int], int] = {}
        messages: list[Message] = []
        for channel in channels:
            messages.append((channel, seen.get(channel, 0)))
            seen[channel] = messages[-1][1] + 1
        assert sorted(messages) == sorted(m for m in sent if m[0][0] in channels[0]
                                          and m[0][1] in channels[0])  # each message once
        for i, u in enumerate(messages):
            for v in messages[i + 1:]:
                if v[0][1] == u[0][0]:  # v flows to u's sender
                    assert used[v] > sent[u], (schedule, replicas, u, v)


def test_the_two_ends_of_a_link_see_mirror_images() -> None:
    dealing = Dealing((1, 1, 1, 1))
    order = replicated_schedule("1f1b", dealing, 8)
    pairs = exchange_order(order, slot_route(dealing), 4)
    assert sorted(pairs) == [(0, 1), (1, 2), (2, 3)]
    one, two = directions(pairs, 1)[2], directions(pairs, 2)[1]
    assert one == [{"send": "recv", "recv": "send"}[d] for d in two]
    assert one.count("send") == one.count("recv") == 8
    # 1F1B: stage 1 sends its warm-up activations before the first gradient comes back
    assert one[:2] == ["send", "send"] and one[-1] == "recv"
    first = directions(pairs, 0)
    assert list(first) == [1] and first[1][0] == "send" and first[1].count("recv") == 8


def test_a_deadlocking_order_has_no_exchange_order() -> None:
    f, b = Kind.FORWARD, Kind.BACKWARD
    order: Order = {0: [Action(0, f, 0), Action(0, Kind.RECV_GRAD, 0), Action(0, b, 0),
                        Action(0, Kind.SEND_ACT, 0)],
                    1: [Action(1, Kind.RECV_ACT, 0), Action(1, f, 0), Action(1, b, 0),
                        Action(1, Kind.SEND_GRAD, 0)]}
    with pytest.raises(ScheduleError, match="schedule deadlocks at rank 0 0B0, rank 1 1F0"):
        exchange_order(order)
