"""The one order in which two ranks exchange their messages (seed 002's impl-SRA).

impl-SRA runs one communication thread per peer for both directions, posting in order
and waiting in order. Two such threads at either end of a link must agree on the order
of the messages between them, or each may wait for a receive whose sender sits queued
behind its own send (in 1F1B a stage pre-posts the receive of micro-batch m+2's
activation while its neighbour still has to be sent m's gradient). Seed 002 builds a
"schedule of inter-stage communication at the start of the epoch"; here it comes from
the schedule itself:

    pairs = exchange_order(order, route)       # {(a, b): [(src, dst), ...]} for a < b
    directions(pairs, rank)                    # {peer: ["send", "recv", ...]}

`exchange_order` runs `order` on paper (`simulate`) and sorts each pair's messages by
when that run sends them (ties: source rank, then position). Since the run is a valid
execution, a rank's receive that one of its sends depends on was sent earlier, so a
thread that follows the order never waits for a send its own rank can only make later.
"""

from __future__ import annotations

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule.action import Order
from approxdist.pipeline.schedule.simulate import Route, simulate, stage_route

Pair = tuple[int, int]
#: the channels (source, destination) of a pair's messages, in the agreed order
Exchange = dict[Pair, list[Pair]]


def exchange_order(order: Order, route: Route = stage_route,
                   num_stages: int | None = None) -> Exchange:
    """Each pair of ranks (a < b) that exchanges messages -> its messages' channels in the
    order a valid run of `order` sends them. `ScheduleError` if `order` deadlocks."""
    timeline = simulate(order, num_stages, route=route)
    if not timeline.completed:
        raise ScheduleError("no message order: the schedule deadlocks at "
                            + ", ".join(f"rank {r} {a}" for r, a in sorted(timeline.stuck.items())),
                            stuck=timeline.stuck)
    sends = sorted((timeline.start[r][i], *route(r, a), i)
                   for r, actions in order.items() for i, a in enumerate(actions) if a.is_send)
    pairs: Exchange = {}
    for _, src, dst, _ in sends:
        pairs.setdefault((min(src, dst), max(src, dst)), []).append((src, dst))
    return pairs


def directions(pairs: Exchange, rank: int) -> dict[int, list[str]]:
    """`rank`'s side of each of its pairs: peer -> "send" / "recv" per message, in order."""
    return {b if a == rank else a: ["send" if src == rank else "recv" for src, _ in channels]
            for (a, b), channels in pairs.items() if rank in (a, b)}
