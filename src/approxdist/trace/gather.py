"""Bring every rank's timeline into one `trace.json` in the run directory.

Two ways, same result (`chrome.merge_traces`):

* `write_trace(rec, ctx, run_dir)` (collective): each rank's Chrome events travel to
  rank 0 with `dist.gather_object`; rank 0 writes `run_dir/trace.json`.
* `save_rank_trace(rec, run_dir)` (no collective): each rank writes
  `trace.rank<N>.json`; `merge_rank_files(run_dir)` (or `approxdist analyze`, when
  `trace.json` is missing) merges them. Use it when a rank may die before the end.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch.distributed as dist

from approxdist.launch.context import DistContext
from approxdist.trace.chrome import TraceDict, merge_traces, rank_trace, read_trace, write_trace_file
from approxdist.trace.errors import TraceError
from approxdist.trace.recorder import Recorder

TRACE_FILE = "trace.json"
_RANK_FILE = re.compile(r"trace\.rank(\d+)\.json$")


def write_trace(rec: Recorder, ctx: DistContext, run_dir: str | Path) -> Path | None:
    """Gather every rank's events on rank 0 and write `run_dir/trace.json` there.

    Collective when distributed and enabled (every rank passes its own recorder; all
    must agree whether tracing is on). Returns the path on rank 0, None elsewhere or
    when the recorder is disabled.
    """
    if not rec.enabled:
        return None
    mine = rank_trace(rec)
    if ctx.distributed:
        box: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
        dist.gather_object(mine, box, dst=0)
        traces: list[TraceDict] = list(box) if box is not None else []
    else:
        traces = [mine]
    if not ctx.is_main:
        return None
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return write_trace_file(merge_traces(traces), run_dir / TRACE_FILE)


def save_rank_trace(rec: Recorder, run_dir: str | Path) -> Path | None:
    """Write this rank's events to `run_dir/trace.rank<N>.json` (no collective)."""
    if not rec.enabled:
        return None
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return write_trace_file(rank_trace(rec), run_dir / f"trace.rank{rec.rank}.json")


def rank_files(run_dir: str | Path) -> list[Path]:
    """The per-rank trace files of a run directory, in rank order."""
    found = [(int(m.group(1)), p) for p in Path(run_dir).glob("trace.rank*.json")
             if (m := _RANK_FILE.search(p.name))]
    return [p for _, p in sorted(found)]


def merge_rank_files(run_dir: str | Path, write: bool = True) -> TraceDict:
    """Merge `trace.rank<N>.json` files into one trace (written as `trace.json` if `write`)."""
    files = rank_files(run_dir)
    if not files:
        raise TraceError(f"{run_dir} holds neither {TRACE_FILE} nor trace.rank<N>.json "
                                f"files; run with tracing on (see docs/tracing.md)")
    trace = merge_traces(read_trace(p) for p in files)
    if write:
        write_trace_file(trace, Path(run_dir) / TRACE_FILE)
    return trace


def load_run_trace(run_dir: str | Path) -> TraceDict:
    """`run_dir/trace.json`, or the merge of the per-rank files when it is missing."""
    path = Path(run_dir) / TRACE_FILE
    return read_trace(path) if path.exists() else merge_rank_files(run_dir, write=False)
