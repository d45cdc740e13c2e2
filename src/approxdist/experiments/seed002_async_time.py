"""`seed002-async`'s account of where each schedule's step goes: bubble, I/W split, weight versions.

Each epoch record gives every rank's compute seconds per step (forwards and backwards; in an
asynchronous stream also its optimiser steps, the `U` actions, which a flushed step runs
after the step instead) and the step's wall time. A schedule's *bubble* is the share of the
step a rank did not compute (waiting for a neighbour, transfers, the flush), the mean over
ranks; its *extra compute* is its compute per step over 1F1B's: what splitting each
backward into I and W costs the zero-bubble schedules, and what the weight versions (a
forward and backward through a version, PipeDream's step per micro-batch) cost the
asynchronous ones. Zero-bubble schedules compute the same gradients as 1F1B (up to float
rounding), so their accuracy is 1F1B's; their claim is speed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from approxdist.bench.stats import median
from approxdist.experiments import markdown as md
from approxdist.experiments.accuracy import noise
from approxdist.experiments.csvio import Row
from approxdist.pipeline.schedule.registry import build_async_schedule

ZERO_BUBBLE = ("zbh1", "zbh2", "zbv")
Rate = Callable[[list[Row], str], float]


def step_split(rec: dict[str, Any]) -> tuple[float, float]:
    """An epoch record's (compute seconds per step, bubble): the mean over ranks of each
    rank's compute per step and of the share of the step it did not compute."""
    step = float(rec.get("step_time_s", 0.0))
    ranks = rec.get("ranks", [])
    if not ranks or step <= 0:
        return 0.0, 0.0
    compute = [float(r["compute_s"]) for r in ranks]
    return sum(compute) / len(compute), sum(max(0.0, 1 - c / step) for c in compute) / len(compute)


def _median(rows: list[Row], schedule: str, column: str) -> float:
    """Median of `column` over the schedule's epochs, the first left out when there are more."""
    mine = [r for r in rows if r["schedule"] == schedule and str(r.get(column, "")) != ""]
    later = [r for r in mine if int(r["epoch"]) > 1] or mine
    return median([float(r[column]) for r in later]) if later else float("nan")


def time_table(rows: list[Row], schedules: tuple[str, ...], sync: str, rate: Rate) -> str:
    """Per schedule: step time, compute per step against 1F1B's, bubble, samples/s ratio."""
    base = _median(rows, sync, "compute_s")
    out = []
    for name in schedules:
        if not any(r["schedule"] == name for r in rows):
            continue
        compute = _median(rows, name, "compute_s")
        step = _median(rows, name, "step_s")
        out.append((name, f"{1e3 * step:.2f}", f"{1e3 * compute:.2f}",
                    f"{compute / base:.3f}x" if base > 0 else "-",
                    md.pct(_median(rows, name, "bubble")),
                    f"{rate(rows, name) / rate(rows, sync):.3f}x"))
    return md.table(("schedule", "step (ms)", "compute per step (ms, mean over ranks)",
                     f"compute vs {sync}", "bubble (share of the step not computing)",
                     f"samples/s vs {sync}"), out)


def zero_bubble_trends(rows: list[Row], fin: dict[str, Any], sync: str, rate: Rate
                       ) -> list[md.Trend]:
    """Each zero-bubble schedule's two claims: 1F1B's accuracy, more samples/s than 1F1B
    (with where its time went against 1F1B's)."""
    out: list[md.Trend] = []
    if sync not in fin:
        return out
    base_compute, base_bubble = _median(rows, sync, "compute_s"), _median(rows, sync, "bubble")
    for name in ZERO_BUBBLE:
        if name not in fin:
            continue
        a, s = fin[name]["test_accuracy"], fin[sync]["test_accuracy"]
        diff = a["mean"] - s["mean"]
        out.append((f"{name} reaches the accuracy of 1F1B (the same gradients, each backward "
                    f"split into I and W)", f"{md.pct(a['mean'])} vs {md.pct(s['mean'])} "
                    f"(1F1B): {md.points(diff)}", diff >= -0.01,
                    f"float rounding differs (W's weight-gradient GEMMs run over several "
                    f"micro-batches at once), nothing else; {noise(a, s)}"))
        ratio = rate(rows, name) / rate(rows, sync)
        compute, bubble = _median(rows, name, "compute_s"), _median(rows, name, "bubble")
        out.append((f"{name}: a split backward fills the bubble, so it trains more samples "
                    f"per second than 1F1B", f"{rate(rows, name):.0f} samples/s vs "
                    f"{rate(rows, sync):.0f} (1F1B): {ratio:.3f}x", ratio > 1.0,
                    f"measured bubble {md.pct(bubble)} vs {md.pct(base_bubble)} (1F1B); "
                    f"compute per step {compute / base_compute:.3f}x 1F1B's (what the split "
                    f"into I and W costs: two autograd passes per backward and the "
                    f"activations held until W)"))
    return out


def versions_why(rows: list[Row], name: str, sync: str) -> str:
    """Where an asynchronous schedule's step went against 1F1B's, for its speed verdict."""
    compute, base = _median(rows, name, "compute_s"), _median(rows, sync, "compute_s")
    if not base > 0:
        return ""
    return (f"; measured bubble {md.pct(_median(rows, name, 'bubble'))} vs "
            f"{md.pct(_median(rows, sync, 'bubble'))} (1F1B); compute per step "
            f"{compute / base:.3f}x 1F1B's (forwards and backwards through weight versions and "
            f"the stream's optimiser steps, which 1F1B runs outside its step)")


def memory_trends(peaks: dict[str, list[int]], stage_bytes: list[int], microbatches: int
                  ) -> list[md.Trend]:
    """Each asynchronous schedule's weight memory (`peaks`: peak version bytes per stage)
    against its limit of versions per stage, in units of the stage's parameter bytes."""
    out: list[md.Trend] = []
    for name, peak in peaks.items():
        if not peak or len(stage_bytes) != len(peak) or min(stage_bytes) <= 0:
            continue
        limit = build_async_schedule(name, 2, microbatches, 2).version_limit
        held = [b / w for b, w in zip(peak, stage_bytes)]
        claim = ("two weight versions per stage" if name == "2bw" else
                 "P - s weight versions on stage s (weight stashing)")
        out.append((f"{name} keeps at most {claim}",
                    "versions held at peak per stage: " + " / ".join(f"{v:.0f}" for v in held),
                    all(v <= limit[s] + 1e-9 for s, v in enumerate(held)),
                    f"peak bytes of the versions beside the module's own weights divided by "
                    f"the stage's parameter bytes ({' / '.join(map(str, stage_bytes))}); the "
                    f"schedule's limits {' / '.join(str(limit[s]) for s in sorted(limit))}; "
                    f"the module's own newest weights come on top"))
    return out
