"""Text views of asynchronous schedules (PipeDream, SOSP'19; PipeDream-2BW, ICML'21).

The grid of `grid.format_grid` with each forward's and backward's weight version (`1F3v1`:
stage 1, forward, micro-batch 3 of the stream, version 1), and what sets an asynchronous
schedule apart from the flushed ones over the same stream of K mini-batches: a smaller
bubble (one fill and drain for the stream instead of one per mini-batch), paid for with
weight versions alive per stage and gradients applied some steps after they were computed.
"""

from __future__ import annotations

from approxdist.pipeline.schedule.action import Action, Order
from approxdist.pipeline.schedule.grid import format_grid, peak_in_flight, timeline_of
from approxdist.pipeline.schedule.registry import build_schedule
from approxdist.pipeline.schedule.versions import (
    AsyncSchedule,
    Stream,
    gradient_delays,
    peak_versions,
)

#: the flushed schedules an asynchronous one is compared with
FLUSHED = ("1f1b", "gpipe")

LEGEND = ("cells <stage><F|B><n>v<version>: n counts micro-batches across the stream (micro-batch "
          "n mod M of mini-batch n div M); version v = the stage's weights after v optimizer "
          "steps; a backward uses its forward's version (weight stashing)")


def format_async_grid(schedule: AsyncSchedule, with_comm: bool = False) -> str:
    """The time-step x rank grid with the weight version of every forward and backward."""
    return format_grid(schedule.order, schedule.num_stages, with_comm, labels=schedule.labels())


def flushed_stream(name: str, num_stages: int, stream: Stream) -> Order:
    """K mini-batches of the flushed schedule `name`, back to back, micro-batches numbered
    across the stream: each mini-batch starts on a rank once that rank finished the last."""
    one = build_schedule(name, num_stages, stream.microbatches)
    return {r: [Action(a.stage, a.kind, a.microbatch + b * stream.microbatches)
                for b in range(stream.minibatches) for a in actions]
            for r, actions in one.items()}


def stream_bubbles(schedule: AsyncSchedule) -> dict[str, float]:
    """Simulated bubble fraction (forward = backward = 1 step) over the schedule's stream:
    the schedule's own, then each flushed schedule's (`FLUSHED`)."""
    p, stream = schedule.num_stages, schedule.stream
    bubbles = {schedule.name: timeline_of(schedule.order, p).bubble_fraction()}
    for name in FLUSHED:
        bubbles[name] = timeline_of(flushed_stream(name, p, stream), p).bubble_fraction()
    return bubbles


def _per_stage(values: dict[int, str]) -> str:
    return ", ".join(f"stage {r}: {values[r]}" for r in sorted(values))


def async_summary(schedule: AsyncSchedule) -> str:
    """Bubble against the flushed schedules, optimizer steps, gradient delay, versions alive
    and in-flight activations, one line each."""
    p, m, k = schedule.num_stages, schedule.stream.microbatches, schedule.stream.minibatches
    bubbles = stream_bubbles(schedule)
    flushed = ", ".join(f"{name} {bubbles[name]:.3f}" for name in FLUSHED)
    steps = schedule.updates.get(0, [])
    per_step = {len(u.items) for u in steps}
    when = ("one after every backward" if per_step == {1} else
            f"one per mini-batch, after its last backward, applying {m} gradients")
    peaks, limits = peak_versions(schedule), schedule.version_limit
    return "\n".join([
        f"bubble fraction over the stream (simulated, forward = backward = 1 step): "
        f"{schedule.name} {bubbles[schedule.name]:.3f} (theory (P-1)/(K*M+P-1) = "
        f"{p - 1}/{k * m + p - 1}); flushed after every mini-batch: {flushed} (theory "
        f"(P-1)/(M+P-1) = {p - 1}/{m + p - 1})",
        f"optimizer steps per stage: {len(steps)}, {when}; the last on stage 0: "
        + "; ".join(map(str, steps[-3:])),
        "gradient delay per stage (steps between the version a gradient was computed at "
        "and the version it updates): " + _per_stage(
            {r: str(d) for r, d in gradient_delays(schedule).items()}),
        "weight versions alive per stage, most (limit): " + _per_stage(
            {r: f"{peaks[r]} ({limits[r]})" for r in peaks}),
        "peak in-flight activations per stage: " + _per_stage(
            {r: str(n) for r, n in peak_in_flight(schedule.order).items()}),
    ])
