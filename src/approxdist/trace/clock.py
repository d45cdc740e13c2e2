"""A common time axis for the ranks' timelines (seed 002 compares processes side by side).

Each rank timestamps with `time.perf_counter_ns()`, whose zero differs per process.
`align_clock` (collective: every rank calls it once, before recording) sets the
recorder's `origin_ns`, the local perf-counter value of the run's common time zero:

* every rank samples the pair (wall clock, perf counter) and all ranks exchange them
  with one `all_gather_object`; rank 0's wall time is the common zero;
* **same host** (all hostnames equal): rank r's origin is rank 0's wall reference mapped
  through r's own wall-minus-perf offset. Every rank reads the same system clock, so the
  alignment error is the sampling jitter of the (wall, perf) pairs: a few microseconds
  (`error_bound_us` records the widest sampling gap observed);
* **several hosts**: wall clocks differ by the NTP error (often milliseconds), so the
  ranks instead leave a `barrier()` together and each takes its perf counter as zero.
  The error is the skew with which ranks leave the barrier, bounded by the barrier's
  duration on the slowest rank (recorded as `error_bound_us`; typically 10-100 us on
  a LAN).

The method and bound go to the trace's `otherData.clock` so a reader knows how far two
ranks' events may be misplaced relative to each other.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import torch.distributed as dist

from approxdist.launch.context import DistContext
from approxdist.trace.recorder import Recorder

_SAMPLES = 5


def wall_minus_perf() -> tuple[int, int]:
    """(wall - perf offset in ns, sampling gap in ns), from the tightest of a few samples."""
    best: tuple[int, int] | None = None
    for _ in range(_SAMPLES):
        p0 = time.perf_counter_ns()
        w = time.time_ns()
        p1 = time.perf_counter_ns()
        gap = p1 - p0
        if best is None or gap < best[1]:
            best = (w - (p0 + p1) // 2, gap)
    assert best is not None
    return best


def align_clock(rec: Recorder, ctx: DistContext) -> dict[str, Any]:
    """Set `rec.origin_ns` to the common zero (collective when distributed); return the
    clock description also stored in `rec.clock`."""
    if not rec.enabled:
        return rec.clock
    offset, gap = wall_minus_perf()
    if not ctx.distributed:
        rec.origin_ns = time.perf_counter_ns()
        rec.clock = {"method": "local", "error_bound_us": 0.0}
        return rec.clock
    mine = (socket.gethostname(), offset, gap, time.time_ns())
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    if len({host for host, *_ in everyone}) == 1:
        reference_wall = everyone[0][3]
        rec.origin_ns = reference_wall - offset
        bound = max(g for _, _, g, _ in everyone) / 1e3
        rec.clock = {"method": "same-host wall clock", "error_bound_us": bound}
    else:
        t0 = time.perf_counter_ns()
        dist.barrier()
        rec.origin_ns = time.perf_counter_ns()
        spans: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(spans, rec.origin_ns - t0)
        rec.clock = {"method": "barrier", "error_bound_us": max(spans) / 1e3}
    return rec.clock
