"""Place the sends and receives around a compute-only schedule (GPipe, PipeDream-Flush).

A schedule author writes only the order of forwards and backwards per rank; this module
adds the communication an executor must perform, in the positions it should post it:
each send right after the compute that produces its data, each receive `prepost`
compute actions before the compute that consumes it (so the transfer overlaps the
computation in between). A split backward's `I` receives and sends the gradient; its `W`
never communicates. Receives are posted in the order of their consumers, so on
every channel the k-th receive expects the k-th send (see `validate`).
"""

from __future__ import annotations

from approxdist.pipeline.schedule.action import GRAD_COMPUTE, Action, Kind, Order


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


def with_comm(compute: Order, num_stages: int, prepost: int = 1) -> Order:
    """Add sends and receives to a compute-only order; `prepost=0` posts just in time."""
    if prepost < 0:
        raise ValueError(f"prepost ({prepost}) must be >= 0")
    return {rank: _rank_with_comm(actions, num_stages, prepost)
            for rank, actions in compute.items()}


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
