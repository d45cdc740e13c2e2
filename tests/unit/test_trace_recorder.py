"""The per-rank recorder: spans, threads, transfer hook, profiler ranges, the disabled path."""

from __future__ import annotations

import threading

import pytest
import torch

from approxdist.launch.context import DistContext
from approxdist.trace import (
    NULL_RECORDER,
    NULL_SPAN,
    RUN_BACK,
    RUN_FOR,
    STEP,
    SYNC,
    WAIT,
    Recorder,
    finish_trace,
    open_recorder,
    rank_trace,
    save_rank_trace,
)
from approxdist.trace.transfers import TransferEvent


def test_span_records_name_class_args_and_nesting() -> None:
    rec = Recorder(3, profiler="never")
    with rec.span(STEP, step=7):
        with rec.span(RUN_FOR, mb=1):
            pass
        with rec.span("custom", cat="compute"):
            pass
    by_name = {e[0]: e for e in rec.events}
    assert set(by_name) == {STEP, RUN_FOR, "custom"}
    assert by_name[STEP][1] == "step" and by_name[STEP][5] == {"step": 7}
    assert by_name[RUN_FOR][1] == "compute" and by_name[RUN_FOR][5] == {"mb": 1}
    assert by_name["custom"][1] == "compute"
    step, fwd = by_name[STEP], by_name[RUN_FOR]
    assert step[2] <= fwd[2] <= fwd[3] <= step[3]  # nested inside the step
    assert {e[4] for e in rec.events} == {0}  # all on the first thread's row


def test_instant_and_complete_keep_explicit_times() -> None:
    rec = Recorder(0, profiler="never")
    rec.complete(RUN_BACK, 1_000, 5_000, mb=2)
    rec.complete("send 0->1", 2_000, 3_000, cat="transfer", row="send to rank 1")
    rec.instant("marker")
    back, moved, mark = rec.events
    assert back[:5] == (RUN_BACK, "compute", 1_000, 5_000, 0) and back[5] == {"mb": 2}
    assert moved[4] == "send to rank 1"
    assert mark[0] == "marker" and mark[3] == -1 and mark[1] == "other"


def test_every_thread_gets_its_own_named_row() -> None:
    rec = Recorder(0, profiler="never")

    def comm_thread() -> None:
        rec.name_thread("comm 0")
        with rec.span(SYNC):
            pass

    with rec.span(RUN_BACK):
        t = threading.Thread(target=comm_thread)
        t.start()
        t.join()
    rows = {e[0]: e[4] for e in rec.events}
    assert rows[RUN_BACK] != rows[SYNC]
    assert rec.thread_names[rows[SYNC]] == "comm 0"
    assert rec.thread_names[rows[RUN_BACK]] == threading.current_thread().name


def test_transfer_hook_makes_transfer_rows_with_bytes_and_lanes() -> None:
    rec = Recorder(0, profiler="never")
    rec.origin_ns = 0
    hook = rec.transfer_hook()
    assert hook is not None
    hook(TransferEvent("send", 0, 1, 4096, 1.0, 1.5))
    hook(TransferEvent("send", 0, 1, 80, 1.2, 1.3))  # overlaps the first: second lane
    hook(TransferEvent("recv", 0, 2, 512, 2.0, 2.1))
    trace = rank_trace(rec)
    moves = [e for e in trace["traceEvents"] if e.get("cat") == "transfer"]
    assert sorted(e["args"]["bytes"] for e in moves) == [80, 512, 4096]
    first = next(e for e in moves if e["args"]["bytes"] == 4096)
    assert first["name"] == "send 0->1" and first["ts"] == 1e6 and first["dur"] == 5e5
    recv = next(e for e in moves if e["args"]["bytes"] == 512)
    assert (recv["args"]["src"], recv["args"]["dst"]) == (2, 0)
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("name") == "thread_name"}
    assert {names[e["tid"]] for e in moves} == {"send to rank 1", "send to rank 1 (2)",
                                                "recv from rank 2"}
    other = rec.transfer_hook(lane="comm1")  # a second Link between the same ranks
    assert other is not None
    other(TransferEvent("recv", 0, 1, 64, 3.0, 3.1))
    (extra,) = [e for e in rank_trace(rec)["traceEvents"] if e.get("args", {}).get("bytes") == 64]
    assert extra["args"]["lane"] == "comm1"


def test_disabled_recorder_records_nothing_and_allocates_no_context() -> None:
    rec = Recorder.off()
    assert rec is NULL_RECORDER and not rec.enabled
    contexts = {id(rec.span(RUN_FOR)), id(rec.span(WAIT, mb=3)), id(rec.span("x", cat="comm"))}
    assert contexts == {id(NULL_SPAN)}
    with rec.span(STEP, step=0):
        rec.instant("mark")
        rec.complete(RUN_FOR, 0, 10)
        rec.name_thread("main")
    assert rec.events == [] and rec.thread_names == {}
    assert rec.transfer_hook() is None  # the link then takes no timestamps at all


def test_disabled_session_makes_no_files_and_no_collectives(tmp_path) -> None:
    ctx = DistContext()
    rec = open_recorder(ctx, enabled=False)
    assert rec is NULL_RECORDER
    assert finish_trace(rec, ctx, tmp_path) is None
    assert save_rank_trace(rec, tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_full_recorder_drops_and_counts() -> None:
    rec = Recorder(0, profiler="never", max_events=2)
    for _ in range(5):
        rec.instant("mark")
    assert len(rec.events) == 2 and rec.dropped == 3


def test_unknown_profiler_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="'auto', 'always' or 'never'"):
        Recorder(0, profiler="sometimes")  # type: ignore[arg-type]


def _profiled_names(rec: Recorder) -> set[str]:
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu) as prof, rec.span(RUN_FOR):
        torch.ones(4).sum()
    return {e.key for e in prof.key_averages()}


def test_spans_are_profiler_ranges_while_profiling() -> None:
    assert RUN_FOR in _profiled_names(Recorder(0, profiler="auto"))
    assert RUN_FOR not in _profiled_names(Recorder(0, profiler="never"))
