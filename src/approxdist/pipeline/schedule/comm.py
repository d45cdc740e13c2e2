"""Place the sends and receives around a compute-only schedule (GPipe, PipeDream-Flush).

A schedule author writes only the order of forwards and backwards per rank; this module
adds the communication an executor must perform, in the positions it should post it:
each send right after the compute that produces its data, each receive `prepost`
compute actions before the compute that consumes it (so the transfer overlaps the
computation in between). A split backward's `I` receives and sends the gradient; its `W`
never communicates. Receives are posted in the order of their consumers, so on
every channel the k-th receive expects the k-th send (see `validate`).

When a rank holds several chunks (ZB-V), two chunk boundaries share the link between two
ranks, whose messages are matched in posting order whichever chunk they belong to: with a
`route` naming channels by ranks, `sender_ordered` then re-posts each rank's receives on
each channel in the order the peer sends, every receive at or before the place
`with_comm` gave it (so none is posted after its consumer).
"""

from __future__ import annotations

from collections.abc import Callable

from approxdist.pipeline.schedule.action import GRAD_COMPUTE, Action, Kind, Order

#: (rank, send or receive) -> its channel (source, destination)
Route = Callable[[int, Action], tuple[int, int]]


def inputs_of(action: Action, num_stages: int) -> list[Action]:
    """The receive that feeds a compute action (none at the ends of the pipeline)."""
    if action.kind is Kind.FORWARD and action.stage > 0:
        return [Action(action.stage, Kind.RECV_ACT, action.microbatch)]
    if action.kind in GRAD_COMPUTE and action.stage < num_stages - 1:
        return [Action(action.stage, Kind.RECV_GRAD, action.microbatch)]
    return []


def outputs_of(action: Action, num_stages: int) -> list[Action]:
    """The send that ships a compute action's result (none at the ends of the pipeline)."""
    if action.kind is Kind.FORWARD and action.stage < num_stages - 1:
        return [Action(action.stage, Kind.SEND_ACT, action.microbatch)]
    if action.kind in GRAD_COMPUTE and action.stage > 0:
        return [Action(action.stage, Kind.SEND_GRAD, action.microbatch)]
    return []


def with_comm(compute: Order, num_stages: int, prepost: int = 1,
              route: Route | None = None) -> Order:
    """Add sends and receives to a compute-only order; `prepost=0` posts just in time;
    `route` (channels between ranks holding several chunks): `sender_ordered`."""
    if prepost < 0:
        raise ValueError(f"prepost ({prepost}) must be >= 0")
    order = {rank: _rank_with_comm(actions, num_stages, prepost)
             for rank, actions in compute.items()}
    return order if route is None else sender_ordered(order, route)


def sender_ordered(order: Order, route: Route) -> Order:
    """Each rank's receives of each channel in the order its peer sends them; the k-th goes
    where the earliest of the k-th and later ones was (module doc)."""
    sent: dict[tuple[int, int], list[Action]] = {}
    for rank, actions in order.items():
        for a in actions:
            if a.is_send:
                sent.setdefault(route(rank, a), []).append(a.matching())
    return {rank: _reposted(rank, actions, route, sent) for rank, actions in order.items()}


def _reposted(rank: int, actions: list[Action], route: Route,
              sent: dict[tuple[int, int], list[Action]]) -> list[Action]:
    before: dict[int, list[Action]] = {}  # index of an action -> receives posted before it
    for channel in {route(rank, a) for a in actions if a.is_recv}:
        at = {a: i for i, a in enumerate(actions) if a.is_recv and route(rank, a) == channel}
        want = [a for a in sent.get(channel, []) if a in at]
        earliest = len(actions)
        for recv in reversed(want):
            earliest = min(earliest, at[recv])
            before.setdefault(earliest, []).insert(0, recv)
    out: list[Action] = []
    for i, a in enumerate(actions):
        out.extend(before.get(i, []))
        if not a.is_recv:
            out.append(a)
    return out


def _rank_with_comm(compute: list[Action], num_stages: int, prepost: int) -> list[Action]:
    posts: list[list[Action]] = [[] for _ in compute]
    for j, action in enumerate(compute):
        posts[max(j - prepost, 0)].extend(inputs_of(action, num_stages))
    out: list[Action] = []
    for j, action in enumerate(compute):
        out.extend(posts[j])
        out.append(action)
        out.extend(outputs_of(action, num_stages))
    return out
