"""Seed 001's overtaking and early forward: the steady-state period of data-parallel steps.

Seed 001 (Sec. 4.3) all-reduces each layer's gradient on CPU threads while backward runs,
lets small layers' all-reduces overtake large ones, and starts the next forward of layer
i as soon as layer i's weights are updated. Priced here on the buckets `dp_time` forms
(their blocks and all-reduce seconds), step after step until the period settles:

- forward of block i at step k+1 starts at max(end of block i-1's forward, end of the
  all-reduce of block i's bucket at step k); backward runs the blocks last to first, and
  bucket j is ready when its earliest block's gradient is;
- the link carries one all-reduce at a time and always the ready bucket whose earliest
  block comes first in the forward (preemptive priority: overtaking), so the first
  layers, needed first, are never stuck behind the large fully-connected ones;
- the period is the time between two consecutive starts of block 0's forward.

With free communication the period is F + B (forward plus backward); when the all-reduces
take longer than the backward and the forward that may overlap them, it is set by the
link (the step no longer depends on the per-node batch: seed 001's t(64, 32) = t(64, 64)
within 2 %).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from approxdist.errors import ConfigError

#: steps played before the period is read (it settles after the first)
STEPS = 6


def early_forward_period(fwd: Sequence[float], bwd: Sequence[float],
                         buckets: Sequence[tuple[Sequence[int], float]],
                         steps: int = STEPS) -> float:
    """Seconds between steps: `fwd`, `bwd` per block; `buckets`: (its blocks, its
    all-reduce seconds) in the order they become ready."""
    if len(fwd) != len(bwd) or steps < 2:
        raise ConfigError(f"early forward needs forward and backward seconds per block "
                          f"({len(fwd)} and {len(bwd)}) and steps >= 2 (got {steps})")
    owner = {i: k for k, (blocks, _) in enumerate(buckets) for i in blocks}
    ends = [0.0] * len(buckets)
    starts: list[float] = []
    free = 0.0  # when the previous step's backward ended
    for step in range(steps):
        t = free
        for i, f in enumerate(fwd):
            if step and i in owner:
                t = max(t, ends[owner[i]])
            if i == 0:
                starts.append(t)
            t += f
        ready = [0.0] * len(bwd)
        for i in reversed(range(len(bwd))):
            t += bwd[i]
            ready[i] = t
        free = t
        ends = serve([(min(blocks), ready[min(blocks)], seconds)
                      for blocks, seconds in buckets])
    return starts[-1] - starts[-2]


def serve(jobs: Sequence[tuple[int, float, float]]) -> list[float]:
    """End times of (priority, ready, seconds) jobs on one server that always runs the
    ready job of the lowest priority number, preempting a later one."""
    left = [seconds for _, _, seconds in jobs]
    ends = [0.0] * len(jobs)
    pending = sorted(range(len(jobs)), key=lambda k: (jobs[k][0], k))
    t = 0.0
    while pending:
        ready = [k for k in pending if jobs[k][1] <= t]
        if not ready:
            t = min(jobs[k][1] for k in pending)
            continue
        k = ready[0]
        sooner = [jobs[j][1] for j in pending if jobs[j][0] < jobs[k][0] and jobs[j][1] > t]
        run = min(left[k], min(sooner, default=math.inf) - t)
        t += run
        left[k] -= run
        if left[k] <= 1e-15:
            ends[k] = t
            pending.remove(k)
    return ends
