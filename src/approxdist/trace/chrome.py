"""Chrome trace format (the JSON that Perfetto and chrome://tracing open) for rank timelines.

A trace is `{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}`. Every
rank is a process (`pid` = rank, row named "rank N"); every thread that recorded is a
thread row (`tid` 0, 1, ... named after the thread); link transfers sit on virtual rows
"send to rank P" / "recv from rank P" (tid >= `VIRTUAL_TID`), split into extra rows
when transfers overlap, so that every row holds properly nested slices. Spans are
complete events (`ph: "X"`, `ts`/`dur` in microseconds from the common zero), markers
are instants (`ph: "i"`), and names come from metadata events (`ph: "M"`).
`otherData.ranks` holds, per rank, the clock alignment, dropped events and metadata.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from approxdist.trace.errors import TraceError
from approxdist.trace.recorder import Event, Recorder

VIRTUAL_TID = 1000
TraceDict = dict[str, Any]


def _us(ns: int) -> float:
    return round(ns / 1e3, 3)


def _rows(events: list[Event]) -> dict[str, list[Event]]:
    """Virtual-row events per row name; overlapping events go to rows "R (2)", ..."""
    named: dict[str, list[Event]] = {}
    for ev in events:
        if isinstance(ev[4], str):
            named.setdefault(ev[4], []).append(ev)
    rows: dict[str, list[Event]] = {}
    for row, evs in named.items():
        ends: list[int] = []  # end of the last event of each row
        for ev in sorted(evs, key=lambda e: (e[2], e[3])):
            k = next((i for i, end in enumerate(ends) if end <= ev[2]), len(ends))
            if k == len(ends):
                ends.append(ev[3])
            ends[k] = ev[3]
            rows.setdefault(row if k == 0 else f"{row} ({k + 1})", []).append(ev)
    return rows


def _event(ev: Event, pid: int, tid: int, origin_ns: int) -> dict[str, Any]:
    name, cat, start, end, _, args = ev
    out: dict[str, Any] = {"name": name, "cat": cat, "pid": pid, "tid": tid,
                           "ts": _us(start - origin_ns)}
    if end < 0:
        out.update(ph="i", s="t")
    else:
        out.update(ph="X", dur=_us(max(0, end - start)))
    if args:
        out["args"] = args
    return out


def _meta(kind: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}


def rank_trace(rec: Recorder) -> TraceDict:
    """One rank's events as a Chrome trace (merge several with `merge_traces`)."""
    pid, events = rec.rank, rec.events
    out = [_meta("process_name", pid, 0, name=f"rank {pid}"),
           _meta("process_sort_index", pid, 0, sort_index=pid)]
    if rec.label:
        out.append(_meta("process_labels", pid, 0, labels=rec.label))
    for tid, name in sorted(rec.thread_names.items()):
        out += [_meta("thread_name", pid, tid, name=name),
                _meta("thread_sort_index", pid, tid, sort_index=tid)]
    out += [_event(ev, pid, ev[4], rec.origin_ns) for ev in events if isinstance(ev[4], int)]
    for i, (name, evs) in enumerate(sorted(_rows(events).items())):
        tid = VIRTUAL_TID + i
        out += [_meta("thread_name", pid, tid, name=name),
                _meta("thread_sort_index", pid, tid, sort_index=tid)]
        out += [_event(ev, pid, tid, rec.origin_ns) for ev in evs]
    info = {"clock": rec.clock, "dropped": rec.dropped, **rec.meta}
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"ranks": {str(pid): info}}}


def merge_traces(traces: Iterable[TraceDict]) -> TraceDict:
    """One trace holding every rank's events, in rank order."""
    events: list[dict[str, Any]] = []
    ranks: dict[str, Any] = {}
    for trace in sorted(traces, key=lambda t: min(map(int, t["otherData"]["ranks"]), default=0)):
        events += trace["traceEvents"]
        ranks.update(trace["otherData"]["ranks"])
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"ranks": ranks}}


def write_trace_file(trace: TraceDict, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(trace, separators=(",", ":")) + "\n")
    return path


def read_trace(path: str | Path) -> TraceDict:
    """A trace file as a dict; `TraceError` naming the file when it is not a Chrome trace."""
    try:
        trace = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path} is not JSON ({exc}); was the run interrupted while "
                         f"writing it?") from exc
    problems = check_trace(trace)
    if problems:
        raise TraceError(f"{path} is not a Chrome trace: {'; '.join(problems[:5])}")
    return trace


_REQUIRED = {"X": ("name", "ts", "dur", "pid", "tid"), "i": ("name", "ts", "pid", "tid"),
             "M": ("name", "pid", "args")}


def check_trace(trace: Any) -> list[str]:
    """What keeps `trace` from being a valid Chrome trace (empty when it is one)."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["no 'traceEvents' list at the top level"]
    problems = []
    for i, ev in enumerate(trace["traceEvents"]):
        fields = _REQUIRED.get(ev.get("ph", "")) if isinstance(ev, dict) else None
        if fields is None:
            problems.append(f"event {i} has no known phase 'ph' (X, i or M): {ev!r:.80}")
        elif missing := [f for f in fields if f not in ev]:
            problems.append(f"event {i} ({ev.get('name')!r}) lacks {', '.join(missing)}")
        elif ev["ph"] == "X" and ev["dur"] < 0:
            problems.append(f"event {i} ({ev['name']!r}) has a negative duration")
    return problems
