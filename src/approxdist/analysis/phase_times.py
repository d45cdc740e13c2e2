"""Where each rank's step goes by phase: self time per span name and step, from a merged trace.

`analyze` puts every instant of a rank's step in one of four classes; this splits the same
steps by the name of the innermost span (`run_for`, `run_back`, `optimizer`, `send_for`,
`wait`, ...), summed over the rank's threads, so a schedule's extra work shows by name: an
asynchronous pipeline's optimizer steps (PipeDream steps after every micro-batch) next to
the forwards and backwards they share the rank with. Time inside a step that no inner span
covers is `step`'s own (the executor between actions). Transfers are left out (they overlap
the spans that wait for them).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from approxdist.analysis.bottleneck import parse_events, skip_steps
from approxdist.analysis.intervals import IntervalSet, self_time
from approxdist.trace.errors import TraceError
from approxdist.trace.phases import STEP_CLASS


def phase_times(trace: dict[str, Any], skip: int = 0) -> dict[int, dict[str, float]]:
    """Per rank, seconds per step of each span name's self time within the rank's steps
    (`skip`: each rank's first steps left out, as `analyze` does), largest first."""
    spans, _ = skip_steps(*parse_events(trace), skip)
    out: dict[int, dict[str, float]] = {}
    for rank in sorted({s.rank for s in spans}):
        mine = [s for s in spans if s.rank == rank]
        steps = [s for s in mine if s.cls == STEP_CLASS]
        if not steps:
            raise TraceError(f"rank {rank} traced no step spans; phase times are per step")
        window = IntervalSet.of((s.start, s.end) for s in steps)
        by_tid = defaultdict(list)
        for s in mine:
            by_tid[s.tid].append(s)
        total: dict[str, float] = defaultdict(float)
        for group in by_tid.values():
            for i, (own, _) in self_time([(s.start, s.end, i) for i, s in enumerate(group)]).items():
                total[group[i].name] += (own & window).length
        out[rank] = {name: t / len(steps) for name, t in
                     sorted(total.items(), key=lambda kv: -kv[1]) if t > 0}
    return out


def format_phase_times(times: dict[int, dict[str, float]], top: int = 8) -> str:
    """One line per rank: its `top` phases in ms per step and their share of the rank's total."""
    lines = ["time per step by phase (self time of the innermost span, ms, summed over threads)"]
    for rank, phases in times.items():
        whole = sum(phases.values()) or 1.0
        cells = [f"{name} {t * 1e3:.2f} ({t / whole:.0%})" for name, t in list(phases.items())[:top]]
        lines.append(f"  rank {rank}: " + ", ".join(cells))
    return "\n".join(lines)
