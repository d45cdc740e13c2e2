"""GPipe (Huang et al. 2019; seed 002): all forwards, then all backwards, then flush.

Every stage keeps the activations of all M micro-batches alive until its backwards
start, so peak in-flight activations per stage is M; bubble (P-1)/(M+P-1).
"""

from __future__ import annotations

from approxdist.pipeline.schedule.action import Action, Kind, Order
from approxdist.pipeline.schedule.comm import with_comm
from approxdist.pipeline.schedule.registry import SCHEDULES


@SCHEDULES.register("gpipe")
def gpipe(num_stages: int, num_microbatches: int) -> Order:
    """GPipe: all M forwards, then all M backwards on every stage (flush)."""
    compute = {
        s: [Action(s, Kind.FORWARD, m) for m in range(num_microbatches)]
        + [Action(s, Kind.BACKWARD, m) for m in range(num_microbatches)]
        for s in range(num_stages)
    }
    return with_comm(compute, num_stages)
