"""ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 6): two chunks per
rank in a V, split backwards, 1F1B's activation memory and no bubble once M >= 2P - 1.

The model is cut into 2P chunks; rank r holds chunk r (on the way down) and chunk 2P-1-r
(on the way back up, `topology.dealing.Dealing.v`), so rank 0 holds the first and the last
chunk and the hand-over from chunk P-1 to chunk P stays on rank P-1. Rank r's order is
torch.distributed.pipelining's `ScheduleZBVZeroBubble`: 2(P-r)-1 warm-up forwards of its
first chunk; r pairs of forwards of both chunks; P-r rounds of (F, I, W) of its second
chunk; then steady rounds of (F, I, W) on each chunk in turn; a cool-down of `I`s whose
`W`s fill the end. With fewer than 2P - 1 micro-batches the order is still valid (an
evaluation batch may be small: the missing micro-batches' actions are left out) but a run
is refused (`zero_bubble.check_microbatches`).
"""

from __future__ import annotations

from approxdist.pipeline.schedule.action import Action, Kind, Order
from approxdist.pipeline.schedule.comm import with_comm
from approxdist.pipeline.schedule.registry import SCHEDULES, register_placement
from approxdist.pipeline.schedule.routes import slot_route
from approxdist.topology.dealing import Dealing

F, I, W = Kind.FORWARD, Kind.BACKWARD_INPUT, Kind.BACKWARD_WEIGHT  # noqa: E741


def rank_order(rank: int, num_ranks: int, num_microbatches: int) -> list[Action]:
    """Rank `rank`'s F, I and W actions on its two chunks (module doc)."""
    p, n = num_ranks, max(2 * num_ranks - 1, num_microbatches)
    down, up = rank, 2 * p - 1 - rank
    order: list[Action] = []
    count = {(c, k): 0 for c in (down, up) for k in (F, I, W)}

    def add(chunk: int, *kinds: Kind) -> None:
        for k in kinds:
            order.append(Action(chunk, k, count[(chunk, k)]))
            count[(chunk, k)] += 1

    for _ in range(2 * (p - rank) - 1):
        add(down, F)
    for _ in range(rank):
        add(up, F)
        add(down, F)
    for _ in range(p - rank):
        add(up, F, I, W)
    while count[(up, F)] < count[(down, F)] or count[(down, F)] < n:
        if count[(down, F)] < n:
            add(down, F)
        add(down, I, W)
        add(up, F, I, W)
    for _ in range(rank):
        add(down, I)
        add(up, I)
    for _ in range(p - rank):
        add(down, I, W)
    while count[(up, W)] < count[(up, I)]:
        add(up, W)
    while count[(down, W)] < count[(down, I)]:
        add(down, W)
    return [a for a in order if a.microbatch < num_microbatches]


@register_placement("zbv", Dealing.v)
@SCHEDULES.register("zbv")
def zbv(num_stages: int, num_microbatches: int) -> Order:
    """ZB-V (zero bubble, 1F1B's memory): two chunks per rank in a V, split backward."""
    p = num_stages
    compute = {r: rank_order(r, p, num_microbatches) for r in range(p)}
    return with_comm(compute, 2 * p, route=slot_route(Dealing.v(p)))
