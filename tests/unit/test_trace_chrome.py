"""Chrome trace export: format, metadata, merging of ranks, files, malformed input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from approxdist.trace import (
    RUN_FOR,
    SEND_FOR,
    STEP,
    Recorder,
    TraceError,
    check_trace,
    load_run_trace,
    merge_rank_files,
    merge_traces,
    rank_trace,
    read_trace,
    save_rank_trace,
)


def _rank(rank: int, origin_ns: int = 0) -> Recorder:
    rec = Recorder(rank, profiler="never", label=f"stage {rank}")
    rec.origin_ns = origin_ns
    rec.complete(STEP, origin_ns + 1_000, origin_ns + 9_000, step=0)
    rec.complete(RUN_FOR, origin_ns + 2_000, origin_ns + 4_500, mb=0)
    rec.instant("mark")
    return rec


def test_rank_trace_is_a_chrome_trace_with_named_rows() -> None:
    trace = json.loads(json.dumps(rank_trace(_rank(1))))  # survives JSON as is
    assert check_trace(trace) == []
    assert trace["displayTimeUnit"] == "ms"
    meta = {(e["name"], e["tid"]): e["args"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert meta[("process_name", 0)] == {"name": "rank 1"}
    assert meta[("process_labels", 0)] == {"labels": "stage 1"}
    assert meta[("thread_name", 0)]["name"]
    spans = {e["name"]: e for e in trace["traceEvents"] if e["ph"] == "X"}
    assert spans[RUN_FOR]["pid"] == 1 and spans[RUN_FOR]["cat"] == "compute"
    assert [e["ph"] for e in trace["traceEvents"] if e["name"] == "mark"] == ["i"]


def test_times_are_microseconds_from_the_rank_origin() -> None:
    a, b = rank_trace(_rank(0, origin_ns=0)), rank_trace(_rank(1, origin_ns=123_456_789))
    for trace in (a, b):
        fwd = next(e for e in trace["traceEvents"] if e["name"] == RUN_FOR)
        assert (fwd["ts"], fwd["dur"]) == (2.0, 2.5)


def test_merge_keeps_every_rank_and_its_clock() -> None:
    recs = [_rank(r) for r in (2, 0, 1)]
    recs[1].clock = {"method": "same-host wall clock", "error_bound_us": 1.5}
    merged = merge_traces(rank_trace(r) for r in recs)
    assert check_trace(merged) == []
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1, 2}
    assert sorted(merged["otherData"]["ranks"]) == ["0", "1", "2"]
    assert merged["otherData"]["ranks"]["0"]["clock"]["error_bound_us"] == 1.5
    first_pids = [e["pid"] for e in merged["traceEvents"] if e["name"] == "process_name"]
    assert first_pids == [0, 1, 2]


def test_rank_files_merge_into_trace_json(tmp_path: Path) -> None:
    for r in range(3):
        rec = _rank(r)
        rec.complete(SEND_FOR, 5_000, 6_000, mb=r)
        save_rank_trace(rec, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "trace.rank0.json", "trace.rank1.json", "trace.rank2.json"]
    from_files = load_run_trace(tmp_path)  # no trace.json yet: merged on the fly
    assert not (tmp_path / "trace.json").exists()
    merged = merge_rank_files(tmp_path)
    assert read_trace(tmp_path / "trace.json") == merged == from_files
    sends = sorted(e["args"]["mb"] for e in merged["traceEvents"] if e["name"] == SEND_FOR)
    assert sends == [0, 1, 2]


def test_bad_traces_are_named(tmp_path: Path) -> None:
    assert check_trace({"events": []}) == ["no 'traceEvents' list at the top level"]
    problems = check_trace({"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "pid": 0},
                                            {"ph": "Q"}]})
    assert "lacks dur, tid" in problems[0] and "no known phase" in problems[1]
    (tmp_path / "trace.json").write_text('{"traceEvents": [')
    with pytest.raises(TraceError, match="is not JSON"):
        read_trace(tmp_path / "trace.json")
    with pytest.raises(TraceError, match="neither trace.json nor"):
        load_run_trace(tmp_path / "empty")
