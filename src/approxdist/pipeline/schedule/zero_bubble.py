"""Zero-bubble schedules ZB-H1 and ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism",
ICLR 2024): 1F1B with each backward split into `I` (input gradient, on the critical path)
and `W` (weight gradient, which waits to fill an idle slot).

Stage s runs `warm-up` forwards, then repeats (forward, I of its oldest micro-batch, and a
`W` whenever more than `defer` micro-batches wait for theirs), then the remaining `I`s
(each followed by a `W` on the same rule), then every `W` left. With equal F, I and W times:

- `zbh1`: 1F1B's warm-up (P - s - 1 forwards), stage s defers s `W`s (torch's
  `ScheduleInterleavedZeroBubble` on one chunk). Bubble (P-1)/(3M+P-1) of the step against
  1F1B's (P-1)/(M+P-1); at most P micro-batches of activations per stage (1F1B's first
  stage), since a deferred `W` keeps them.
- `zbh2`: warm-up 2(P - s - 1) forwards fills the start of the pipeline, and stage s defers
  2s `W`s to fill its end: no bubble once M >= 2P - 1, for up to 2P - 1 micro-batches of
  activations (about twice 1F1B's). With fewer micro-batches the warm-up cannot fill: the
  order is still valid (an evaluation batch may be small) but a run is refused
  (`check_microbatches`, called by `pipeline.runtime.check_run` and `schedule show`).
"""

from __future__ import annotations

from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule.action import Action, Kind, Order
from approxdist.pipeline.schedule.comm import with_comm
from approxdist.pipeline.schedule.registry import SCHEDULES


def stage_order(stage: int, num_microbatches: int, warmup: int, defer: int) -> list[Action]:
    """Stage `stage`'s F, I and W actions of micro-batches 0..M-1 (module doc)."""
    m = num_microbatches
    order = [Action(stage, Kind.FORWARD, i) for i in range(min(warmup, m))]
    forwards, inputs, weights = len(order), 0, 0

    def backward() -> None:
        nonlocal inputs, weights
        order.append(Action(stage, Kind.BACKWARD_INPUT, inputs))
        inputs += 1
        if inputs - weights > defer:
            order.append(Action(stage, Kind.BACKWARD_WEIGHT, weights))
            weights += 1

    while forwards < m:
        order.append(Action(stage, Kind.FORWARD, forwards))
        forwards += 1
        backward()
    while inputs < m:
        backward()
    return order + [Action(stage, Kind.BACKWARD_WEIGHT, w) for w in range(weights, m)]


def min_microbatches(name: str, num_stages: int) -> int:
    """The fewest micro-batches schedule `name` runs (ZB-H2 and ZB-V: 2P - 1 fill their
    warm-up)."""
    return 2 * num_stages - 1 if name in ("zbh2", "zbv") else 1


def check_microbatches(name: str, num_stages: int, num_microbatches: int) -> None:
    """`ScheduleError` naming the count and the fix when `name` needs more micro-batches."""
    need = min_microbatches(name, num_stages)
    if need > 1 and num_microbatches < need:
        raise ScheduleError(f"{name} at {num_stages} stages needs at least {need} micro-batches "
                            f"(2P - 1, to fill its warm-up) but got {num_microbatches}; use "
                            f"--microbatches {need} or more, or zbh1")


@SCHEDULES.register("zbh1")
def zbh1(num_stages: int, num_microbatches: int) -> Order:
    """ZB-H1 (zero bubble, 1F1B's memory): split backward, stage s defers s weight gradients."""
    p = num_stages
    compute = {s: stage_order(s, num_microbatches, p - s - 1, s) for s in range(p)}
    return with_comm(compute, p)


@SCHEDULES.register("zbh2")
def zbh2(num_stages: int, num_microbatches: int) -> Order:
    """ZB-H2 (zero bubble, about 2x 1F1B's memory): 2(P-s-1) warm-up forwards, 2s deferred W."""
    p = num_stages
    compute = {s: stage_order(s, num_microbatches, 2 * (p - s - 1), 2 * s) for s in range(p)}
    return with_comm(compute, p)
