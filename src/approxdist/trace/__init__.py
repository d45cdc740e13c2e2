"""Per-rank timelines in seed 002's phase vocabulary -> one Chrome trace (the recorder).

    from approxdist.trace import RUN_FOR, open_recorder, finish_trace
    rec = open_recorder(ctx, enabled=True)
    with rec.span(RUN_FOR, mb=0):
        ...
    finish_trace(rec, ctx, run_dir)        # run_dir/trace.json, opens in Perfetto

See docs/tracing.md; `approxdist analyze RUN_DIR` reads the result (the analysis lives
in `approxdist.analysis`, a layer above the engines: this package, which every engine
imports, holds only the recorder and its helpers).
"""

from approxdist.trace.chrome import check_trace, merge_traces, rank_trace, read_trace
from approxdist.trace.clock import align_clock
from approxdist.trace.errors import TraceError
from approxdist.trace.gather import load_run_trace, merge_rank_files, save_rank_trace, write_trace
from approxdist.trace.phases import (
    DATA,
    DECODE,
    ENCODE,
    OPTIMIZER,
    PHASES,
    RECEIVE_BACK,
    RECEIVE_FOR,
    RUN_BACK,
    RUN_FOR,
    SEND_BACK,
    SEND_FOR,
    STEP,
    SYNC,
    WAIT,
)
from approxdist.trace.recorder import NULL_RECORDER, NULL_SPAN, NullRecorder, Recorder
from approxdist.trace.session import finish_trace, open_recorder

__all__ = [
    "DATA", "DECODE", "ENCODE", "NULL_RECORDER", "NULL_SPAN", "OPTIMIZER", "PHASES",
    "RECEIVE_BACK", "RECEIVE_FOR", "RUN_BACK", "RUN_FOR", "SEND_BACK", "SEND_FOR", "STEP",
    "SYNC", "WAIT", "NullRecorder", "Recorder", "TraceError", "align_clock",
    "check_trace", "finish_trace", "load_run_trace", "merge_rank_files",
    "merge_traces", "open_recorder", "rank_trace", "read_trace", "save_rank_trace",
    "write_trace",
]
