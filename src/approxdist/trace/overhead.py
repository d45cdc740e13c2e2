"""Benchmark: what one `with rec.span(...)` costs, disabled and enabled (issue 7 budget).

    python -m approxdist.trace.overhead [--calls N]

Prints nanoseconds per span for the disabled recorder, an enabled one with and without
`torch.profiler.record_function` ranges, and inside an active `torch.profiler` session,
each as a ratio to the named baseline measured in the same run: the same loop with a
bare `with` on a shared no-op context (the least a `with` line can cost).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from approxdist.trace.phases import RUN_FOR
from approxdist.trace.recorder import NULL_RECORDER, NULL_SPAN, Recorder


def per_call_ns(body: Callable[[], None], calls: int, repeats: int = 5) -> float:
    """Best-of-`repeats` nanoseconds per call of `body` (its loop overhead included)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            body()
        best = min(best, (time.perf_counter_ns() - t0) / calls)
    return best


def _with(ctx: Callable[[], object]) -> Callable[[], None]:
    def body() -> None:
        with ctx():  # type: ignore[attr-defined]
            pass
    return body


def measure(calls: int) -> list[tuple[str, float]]:
    """(case, ns per span) for every case; the first row is the baseline."""
    never = Recorder(profiler="never", max_events=calls * 6)
    auto = Recorder(profiler="auto", max_events=calls * 6)
    always = Recorder(profiler="always", max_events=calls * 6)
    rows = [
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
        rows.append(("enabled, 'auto' inside torch.profiler",
                     per_call_ns(_with(lambda: auto.span(RUN_FOR)), max(1, calls // 10), 2)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000, help="spans per measurement")
    args = parser.parse_args(argv)
    rows = measure(args.calls)
    base = rows[0][1]
    print(f"{'case':<46} {'ns/span':>9} {'x baseline':>11}")
    for name, ns in rows:
        print(f"{name:<46} {ns:>9.0f} {ns / base:>11.2f}")
    print(f"\nreproduce: python -m approxdist.trace.overhead --calls {args.calls}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
