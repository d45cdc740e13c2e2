"""Timing: one call, a call repeated, and rounds that interleave every variant with its baseline.

`Timing` says how many rounds of how many steps, after how many warm-up steps, a
distributed benchmark times on its ranks (`bench pipeline`, `hybrid`, `tp`).

`interleave` runs each variant `warmup` times (not timed), then `rounds` rounds in which
every variant runs `per_round` times in turn, optionally alternating the order every
round (so neither side always runs first); drift on the machine then hits every variant
alike. A `before`/`after` hook around each timed call lets distributed benchmarks put a
barrier there, or finish a variant's outstanding work without charging it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

Op = Callable[[], object]


@dataclass(frozen=True)
class Timing:
    """How many rounds, of how many steps, after how many warm-up steps."""

    rounds: int = 5
    steps: int = 10
    warmup: int = 3


def timed(op: Op, sync: Callable[[], object] | None = None) -> float:
    """Seconds `op()` took; `sync` (a device synchronise) runs before the clock starts and
    again before it stops, so queued work is neither charged nor missed."""
    if sync is not None:
        sync()
    t0 = time.perf_counter()
    op()
    if sync is not None:
        sync()
    return time.perf_counter() - t0


def repeat(op: Op, times: int) -> Callable[[], None]:
    """One call that runs `op` `times` times (a round of several steps, timed as one)."""

    def run() -> None:
        for _ in range(times):
            op()

    return run


def interleave(ops: Mapping[str, Op], rounds: int, *, per_round: int = 1, warmup: int = 0,
               alternate: bool = False, sync: Callable[[], object] | None = None
               ) -> dict[str, list[float]]:
    """Seconds of every timed call per variant, in order (`rounds * per_round` each)."""
    for op in ops.values():
        for _ in range(warmup):
            op()
    times: dict[str, list[float]] = {name: [] for name in ops}
    names = list(ops)
    for r in range(rounds):
        order = names if not (alternate and r % 2) else names[::-1]
        for name in order:
            for _ in range(per_round):
                times[name].append(timed(ops[name], sync))
    return times
