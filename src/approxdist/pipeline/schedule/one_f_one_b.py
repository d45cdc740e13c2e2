"""1F1B, a.k.a. PipeDream-Flush (Narayanan et al. 2021; seed 002): one forward, one backward.

Stage s runs min(P - s - 1, M) warm-up forwards, then alternates one forward and one
backward (steady state), then the remaining backwards (cool-down), then flushes. Same
bubble as GPipe, (P-1)/(M+P-1), but at most min(P - s, M) activations in flight on
stage s instead of M: the memory advantage of 1F1B.
"""

from __future__ import annotations

from approxdist.pipeline.schedule.action import Action, Kind, Order
from approxdist.pipeline.schedule.comm import with_comm
from approxdist.pipeline.schedule.registry import SCHEDULES


def stage_order(stage: int, num_stages: int, num_microbatches: int) -> list[Action]:
    """Stage `stage`'s forwards and backwards of micro-batches 0..M-1 in 1F1B order."""
    warmup = min(num_stages - stage - 1, num_microbatches)
    fwd = [Action(stage, Kind.FORWARD, m) for m in range(num_microbatches)]
    bwd = [Action(stage, Kind.BACKWARD, m) for m in range(num_microbatches)]
    order = fwd[:warmup]
    for i in range(num_microbatches - warmup):
        order += [fwd[warmup + i], bwd[i]]
    return order + bwd[num_microbatches - warmup:]


@SCHEDULES.register("1f1b")
def one_f_one_b(num_stages: int, num_microbatches: int) -> Order:
    """1F1B (PipeDream-Flush): P-s-1 warm-up forwards, then alternate, then cool-down."""
    compute = {s: stage_order(s, num_stages, num_microbatches) for s in range(num_stages)}
    return with_comm(compute, num_stages)
