"""Text views of asynchronous schedules (PipeDream, SOSP'19; PipeDream-2BW, ICML'21).

The grid of `grid.format_grid` with each forward's and backward's weight version (`1F3v1`:
stage 1, forward, micro-batch 3 of the stream, version 1), and what sets an asynchronous
schedule apart from the flushed ones over the same stream of K mini-batches: a smaller
bubble (one fill and drain for the stream instead of one per mini-batch), paid for with
weight versions alive per stage and gradients applied some steps after they were computed.
With replicated stages (hybrid) the rows are ranks in stage-major order, messages route
between the replicas that handle each micro-batch, `AR` sums a stage's step gradient over
its replicas, and the flushed schedules compared are the replicated ones (1F1B-RR).
"""

from __future__ import annotations

from approxdist.pipeline.schedule.action import Action, Order
from approxdist.pipeline.schedule.grid import format_grid, peak_in_flight, timeline_of
from approxdist.pipeline.schedule.registry import build_schedule
from approxdist.pipeline.schedule.replicated import replicated_schedule
from approxdist.pipeline.schedule.routes import slot_route
from approxdist.pipeline.schedule.simulate import Route, stage_route
from approxdist.pipeline.schedule.versions import (
    AsyncSchedule,
    Stream,
    gradient_delays,
    peak_versions,
)
from approxdist.topology.dealing import Dealing

#: the flushed schedules an asynchronous one is compared with
FLUSHED = ("1f1b", "gpipe")

def route_of(schedule: AsyncSchedule) -> Route:
    """Channels by stage, or between slots when stages are replicated."""
    return slot_route(schedule.placement) if schedule.dealing is not None else stage_route


LEGEND = ("cells <stage><F|B><n>v<version>: n counts micro-batches across the stream (micro-batch "
          "n mod M of mini-batch n div M); version v = the stage's weights after v optimizer "
          "steps; a backward uses its forward's version (weight stashing)")


def format_async_grid(schedule: AsyncSchedule, with_comm: bool = False) -> str:
    """The time-step x rank grid with the weight version of every forward and backward."""
    return format_grid(schedule.order, schedule.num_stages, with_comm, route_of(schedule),
                       labels=schedule.labels())


def flushed_stream(name: str, num_stages: int, stream: Stream,
                   dealing: Dealing | None = None) -> Order:
    """K mini-batches of the flushed schedule `name`, back to back, micro-batches numbered
    across the stream: each mini-batch starts on a rank once that rank finished the last
    (dealt to replicated stages as `dealing` says; M a multiple of each replica count)."""
    one = (build_schedule(name, num_stages, stream.microbatches) if dealing is None
           else replicated_schedule(name, dealing, stream.microbatches))
    return {r: [Action(a.stage, a.kind, a.microbatch + b * stream.microbatches)
                for b in range(stream.minibatches) for a in actions]
            for r, actions in one.items()}


def stream_bubbles(schedule: AsyncSchedule) -> dict[str, float]:
    """Simulated bubble fraction (forward = backward = 1 step) over the schedule's stream:
    the schedule's own, then each flushed schedule's (`FLUSHED`)."""
    p, stream, route = schedule.num_stages, schedule.stream, route_of(schedule)
    bubbles = {schedule.name: timeline_of(schedule.order, p, route=route).bubble_fraction()}
    for name in FLUSHED:
        flushed = flushed_stream(name, p, stream, schedule.dealing)
        bubbles[name] = timeline_of(flushed, p, route=route).bubble_fraction()
    return bubbles


def _per_stage(values: dict[int, str], schedule: AsyncSchedule) -> str:
    """`stage s: value` per rank, or `rank r (stage s): value` when stages are replicated."""
    if schedule.dealing is None:
        return ", ".join(f"stage {r}: {values[r]}" for r in sorted(values))
    return ", ".join(f"rank {r} (stage {schedule.stage_of(r)}): {values[r]}"
                     for r in sorted(values))


def _steps_line(schedule: AsyncSchedule) -> str:
    m = schedule.stream.microbatches
    if schedule.dealing is None:
        steps = schedule.updates.get(0, [])
        per_step = {len(u.items) for u in steps}
        when = ("one after every backward" if per_step == {1} else
                f"one per mini-batch, after its last backward, applying {m} gradients")
        return (f"optimizer steps per stage: {len(steps)}, {when}; the last on stage 0: "
                + "; ".join(map(str, steps[-3:])))
    parts = []
    for stage, count in enumerate(schedule.placement.replicas):
        steps = schedule.updates[schedule.slots_of(stage)[0]]
        items = schedule.stream.items // len(steps) if steps else 0
        parts.append(f"stage {stage}: {len(steps)}, one per {items} micro-batch(es)"
                     + (f" ({items // count} on each of {count} replicas, summed by AR)"
                        if count > 1 else ""))
    return ("optimizer steps per stage, every replica of a stage in lockstep: "
            + "; ".join(parts))


def async_summary(schedule: AsyncSchedule) -> str:
    """Bubble against the flushed schedules, optimizer steps, gradient delay, versions alive
    and in-flight activations, one line each."""
    p, m, k = schedule.num_stages, schedule.stream.microbatches, schedule.stream.minibatches
    bubbles = stream_bubbles(schedule)
    flushed = ", ".join(f"{name} {bubbles[name]:.3f}" for name in FLUSHED)
    theory = ((f" (theory (P-1)/(K*M+P-1) = {p - 1}/{k * m + p - 1})", f" (theory "
               f"(P-1)/(M+P-1) = {p - 1}/{m + p - 1})") if schedule.dealing is None
              else ("", " (replicated: 1F1B-RR)"))
    peaks, limits = peak_versions(schedule), schedule.version_limit
    return "\n".join([
        f"bubble fraction over the stream (simulated, forward = backward = 1 step): "
        f"{schedule.name} {bubbles[schedule.name]:.3f}{theory[0]}; flushed after every "
        f"mini-batch: {flushed}{theory[1]}",
        _steps_line(schedule),
        "gradient delay per stage (steps between the version a gradient was computed at "
        "and the version it updates): " + _per_stage(
            {r: str(d) for r, d in gradient_delays(schedule).items()}, schedule),
        "weight versions alive per stage, most (limit): " + _per_stage(
            {r: f"{peaks[r]} ({limits[r]})" for r in peaks}, schedule),
        "peak in-flight activations per stage: " + _per_stage(
            {r: str(n) for r, n in peak_in_flight(schedule.order).items()}, schedule),
    ])
