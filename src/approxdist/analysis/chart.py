"""The timeline chart of `approxdist analyze`: ranks x time, coloured by phase (seed 002).

One row per rank and thread that recorded spans (each instant drawn in the colour of
the innermost phase, as the analysis counts it), plus one thin row per rank for its link
transfers. Written with matplotlib's Agg backend: no display needed.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from approxdist.analysis.bottleneck import Span, Transfer, parse_events
from approxdist.analysis.intervals import IntervalSet, self_time
from approxdist.trace.phases import CLASS_COLOURS, PHASE_COLOURS, PHASES, STEP_CLASS, TRANSFER

Segments = dict[str, list[tuple[float, float]]]  # colour key -> (start, width) in ms


def thread_names(trace: dict[str, Any]) -> dict[tuple[int, int], str]:
    """(pid, tid) -> thread row name, from the trace's metadata events."""
    return {(ev["pid"], ev["tid"]): ev["args"]["name"] for ev in trace.get("traceEvents", [])
            if ev.get("ph") == "M" and ev.get("name") == "thread_name"}


def step_range(spans: list[Span], last: int) -> tuple[float, float] | None:
    """(start, end) in seconds covering every rank's `last` steps, or None."""
    chosen: list[tuple[float, float]] = []
    for rank in {s.rank for s in spans}:
        steps = sorted((s.start, s.end) for s in spans if s.cls == STEP_CLASS and s.rank == rank)
        chosen += steps[-last:] if last > 0 else []
    if not chosen:
        return None
    return min(a for a, _ in chosen), max(b for _, b in chosen)


def _clip(ivs: IntervalSet, window: IntervalSet | None, t0: float) -> list[tuple[float, float]]:
    inside = ivs & window if window is not None else ivs
    return [((a - t0) * 1e3, (b - a) * 1e3) for a, b in inside.spans]


def _rows(spans: list[Span], transfers: list[Transfer], names: dict[tuple[int, int], str],
          window: IntervalSet | None, t0: float) -> list[tuple[str, Segments, float]]:
    """(label, segments per colour key, bar height) per row, top row first."""
    by_row: dict[tuple[int, int], list[Span]] = defaultdict(list)
    for s in spans:
        by_row[(s.rank, s.tid)].append(s)
    tids: dict[int, list[int]] = defaultdict(list)
    for rank, tid in sorted(by_row):
        tids[rank].append(tid)
    rows: list[tuple[str, Segments, float]] = []
    for rank in sorted(tids):
        for tid in tids[rank]:
            group = by_row[(rank, tid)]
            segs: Segments = defaultdict(list)
            for i, (ivs, _) in self_time([(s.start, s.end, i) for i, s in enumerate(group)]).items():
                if group[i].cls != STEP_CLASS:
                    segs[group[i].name] += _clip(ivs, window, t0)
            label = f"rank {rank}" + (f" / {names.get((rank, tid), tid)}" if len(tids[rank]) > 1
                                      else "")
            rows.append((label, segs, 0.8))
        moves = IntervalSet.of((t.start, t.end) for t in transfers if t.rank == rank)
        if moves.spans:
            rows.append((f"rank {rank} link", {TRANSFER: _clip(moves, window, t0)}, 0.35))
    return rows


def _colour(key: str) -> str:
    return PHASE_COLOURS.get(key) or CLASS_COLOURS.get(key) or CLASS_COLOURS["other"]


def draw_timeline(trace: dict[str, Any], path: str | Path, title: str = "timeline",
                  last_steps: int = 0) -> Path:
    """Write the chart as a PNG; `last_steps` > 0 zooms on every rank's last steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    spans, transfers = parse_events(trace)
    zoom = step_range(spans, last_steps)
    window = IntervalSet.of([zoom]) if zoom else None
    t0 = zoom[0] if zoom else min((s.start for s in spans), default=0.0)
    rows = _rows(spans, transfers, thread_names(trace), window, t0)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.55 * max(1, len(rows))))
    used: list[str] = []
    for y, (_, segs, height) in enumerate(reversed(rows)):
        for key, bars in sorted(segs.items()):
            ax.broken_barh(bars, (y - height / 2, height), facecolors=_colour(key), linewidth=0)
            if bars and key not in used:
                used.append(key)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in reversed(rows)])
    ax.set_xlabel("time since the start of the window (ms)")
    ax.set_ylabel("rank / row")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    order = {k: i for i, k in enumerate((*PHASES, TRANSFER))}
    used.sort(key=lambda k: (order.get(k, len(order)), k))
    ax.legend(handles=[Patch(color=_colour(k), label=k) for k in used], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize="small", title="phase")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
