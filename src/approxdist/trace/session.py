"""The two calls an engine needs: open a rank's recorder, and write the merged trace.

    rec = open_recorder(ctx, enabled=cfg.train.trace)      # collective when enabled
    link = Link(ctx, spec, hook=rec.transfer_hook())       # None when disabled
    with rec.span(STEP, step=i): ...                       # the engine's phases
    finish_trace(rec, ctx, run_dir)                        # collective; rank 0 writes trace.json

With `enabled=False` both calls are free and make no collective call (every rank must
pass the same flag).
"""

from __future__ import annotations

from pathlib import Path

from approxdist.launch.context import DistContext
from approxdist.trace.clock import align_clock
from approxdist.trace.gather import write_trace
from approxdist.trace.recorder import DEFAULT_MAX_EVENTS, NULL_RECORDER, ProfilerMode, Recorder


def open_recorder(ctx: DistContext, enabled: bool, *, profiler: ProfilerMode = "auto",
                  max_events: int = DEFAULT_MAX_EVENTS, label: str = "") -> Recorder:
    """This rank's recorder with its clock aligned to rank 0's, or `NULL_RECORDER`."""
    if not enabled:
        return NULL_RECORDER
    rec = Recorder(ctx.rank, profiler=profiler, max_events=max_events, label=label)
    align_clock(rec, ctx)
    return rec


def finish_trace(rec: Recorder, ctx: DistContext, run_dir: str | Path) -> Path | None:
    """Gather all ranks' events and write `run_dir/trace.json` on rank 0 (path there)."""
    return write_trace(rec, ctx, run_dir)
