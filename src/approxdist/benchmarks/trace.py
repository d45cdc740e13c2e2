"""What one `with rec.span(...)` costs, disabled and enabled, against a bare `with` (docs/tracing.md).

Nanoseconds per span for the disabled recorder, an enabled one with and without
`torch.profiler.record_function` ranges, and inside an active `torch.profiler` session,
each as a ratio to the baseline measured in the same run: the same loop with a bare
`with` on a shared no-op context (the least a `with` line can cost). Each figure is the
best of 5 loops of `calls` spans (the loop's own overhead included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from approxdist.bench.report import Column
from approxdist.bench.timing import timed
from approxdist.trace.phases import RUN_FOR
from approxdist.trace.recorder import NULL_RECORDER, NULL_SPAN, Recorder

COLUMNS = (Column("case", 46, "case", left=True), Column("ns/span", 9, "ns_per_span", ".0f"),
           Column("x baseline", 11, "ratio_vs_baseline", ".2f"))


def per_call_ns(body: Callable[[], None], calls: int, repeats: int = 5) -> float:
    """Best-of-`repeats` nanoseconds per call of `body` (its loop overhead included)."""
    def loop() -> None:
        for _ in range(calls):
            body()

    return min(timed(loop) for _ in range(repeats)) * 1e9 / calls


def _with(ctx: Callable[[], object]) -> Callable[[], None]:
    def body() -> None:
        with ctx():  # type: ignore[attr-defined]
            pass
    return body


def measure(calls: int) -> list[dict[str, Any]]:
    """One row per case (ns per span, ratio to the first row, the baseline)."""
    never = Recorder(profiler="never", max_events=calls * 6)
    auto = Recorder(profiler="auto", max_events=calls * 6)
    always = Recorder(profiler="always", max_events=calls * 6)
    cases = [
        ("baseline: with NULL_SPAN", per_call_ns(_with(lambda: NULL_SPAN), calls)),
        ("disabled: NULL_RECORDER.span(RUN_FOR)",
         per_call_ns(_with(lambda: NULL_RECORDER.span(RUN_FOR)), calls)),
        ("disabled, with args: span(RUN_FOR, mb=3)",
         per_call_ns(_with(lambda: NULL_RECORDER.span(RUN_FOR, mb=3)), calls)),
        ("enabled, profiler='never'", per_call_ns(_with(lambda: never.span(RUN_FOR)), calls)),
        ("enabled, profiler='auto' (no profiler)",
         per_call_ns(_with(lambda: auto.span(RUN_FOR)), calls)),
        ("enabled, profiler='always' (record_function)",
         per_call_ns(_with(lambda: always.span(RUN_FOR)), calls)),
    ]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        cases.append(("enabled, 'auto' inside torch.profiler",
                      per_call_ns(_with(lambda: auto.span(RUN_FOR)), max(1, calls // 10), 2)))
    base = cases[0][1]
    return [{"case": name, "ns_per_span": ns, "ratio_vs_baseline": ns / base} for name, ns in cases]
