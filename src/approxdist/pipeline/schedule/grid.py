"""Text views of a schedule: a time-step x rank grid (like torch.distributed.pipelining's)
plus the numbers that tell schedules apart: bubble fraction and in-flight activations.

Time steps come from `simulate` with every forward and backward taking one step; with
`with_comm`, each send and receive post also takes a step of its own. GPipe and
PipeDream-Flush (1F1B) share the bubble (P-1)/(M+P-1) (seed 002) but differ in memory.
"""

from __future__ import annotations

from collections.abc import Mapping

from approxdist.pipeline.schedule.action import Order, is_split, live_change
from approxdist.pipeline.schedule.simulate import Durations, Route, Timeline, simulate, stage_route

IDLE = "."


def timeline_of(order: Order, num_stages: int | None = None,
                with_comm: bool = False, route: Route = stage_route) -> Timeline:
    """Unit-time simulation: compute takes 1 step; comm takes 1 step if shown, else 0."""
    return simulate(order, num_stages, Durations(comm=1.0 if with_comm else 0.0), route)


def format_grid(order: Order, num_stages: int | None = None, with_comm: bool = False,
                route: Route = stage_route,
                labels: Mapping[tuple[int, int], str] | None = None) -> str:
    """Rows are ranks, columns time steps; idle steps print as '.'; a deadlock is noted.
    `labels[(rank, index)]` replaces an action's cell text (weight versions: `1F3v1`)."""
    timeline = timeline_of(order, num_stages, with_comm, route)
    steps = int(timeline.makespan)
    cells = {r: [IDLE] * steps for r in order}
    text = labels or {}
    for r, actions in order.items():
        for i, (a, t0, t1) in enumerate(zip(actions, timeline.start[r], timeline.end[r])):
            for t in range(int(t0), int(t1)):
                cells[r][t] = text.get((r, i), str(a))
    width = max([len(IDLE), len(str(max(steps - 1, 0)))]
                + [len(c) for row in cells.values() for c in row])
    label = max(len(f"rank {r}") for r in order) if order else 4
    lines = [f"{'step':<{label}} " + " ".join(f"{t:>{width}}" for t in range(steps))]
    for r in sorted(order):
        lines.append(f"{f'rank {r}':<{label}} "
                     + " ".join(f"{c:>{width}}" for c in cells[r]))
    if not timeline.completed:
        lines.append("deadlock: " + "; ".join(
            f"rank {r} blocked at {a} waiting for {timeline.waiting_for[r]}"
            for r, a in sorted(timeline.stuck.items())))
    return "\n".join(line.rstrip() for line in lines)


def theoretical_bubble(num_stages: int, num_microbatches: int) -> float:
    """(P-1)/(M+P-1): idle share of GPipe and 1F1B when forward and backward take equal time."""
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def peak_in_flight(order: Order) -> dict[int, int]:
    """Per rank, the most micro-batches whose forward ran and backward did not yet (a split
    backward holds its activations until its `W`)."""
    peaks: dict[int, int] = {}
    for r, actions in order.items():
        live = peak = 0
        for a in actions:
            live += live_change(a)
            peak = max(peak, live)
        peaks[r] = peak
    return peaks


def split_bubble(num_stages: int, num_microbatches: int, chunks: int = 1) -> float:
    """(P-1)/(3cM+P-1): idle share of a zero-bubble schedule's step on c chunks per rank when
    F, I and W of a chunk take equal time (the pipeline's fill and drain, Qi et al. 2024; ZB-V:
    c = 2); 1F1B's stays (P-1)/(M+P-1)."""
    return (num_stages - 1) / (3 * chunks * num_microbatches + num_stages - 1)


def idle_within(timeline: Timeline) -> dict[int, float]:
    """Per rank, idle time between its first and its last compute: the bubble consecutive
    steps cannot hide by overlapping (ZB-H2's is 0, its fill and drain only stagger)."""
    idle: dict[int, float] = {}
    for r, actions in timeline.order.items():
        spans = [(s, e) for a, s, e in zip(actions, timeline.start[r], timeline.end[r])
                 if a.is_compute]
        idle[r] = (spans[-1][1] - spans[0][0] - sum(e - s for s, e in spans)) if spans else 0.0
    return idle


def summary(order: Order, num_stages: int, num_microbatches: int,
            route: Route = stage_route, per: str = "stage") -> str:
    """Bubble fraction (theory and unit-time simulation) and peak in-flight activations;
    for a split backward also the idle steps inside each rank's span."""
    p, m = num_stages, num_microbatches
    timeline = timeline_of(order, num_stages, route=route)
    peaks = peak_in_flight(order)
    peak_line = (f"peak in-flight activations per {per}: "
                 + ", ".join(f"{per} {r}: {peaks[r]}" for r in sorted(peaks)))
    if not any(is_split(actions) for actions in order.values()):
        return "\n".join([
            f"bubble fraction: theory (P-1)/(M+P-1) = {p - 1}/{m + p - 1} = "
            f"{theoretical_bubble(p, m):.3f}; simulated (forward = backward = 1 step) = "
            f"{timeline.bubble_fraction():.3f}", peak_line])
    idle = idle_within(timeline)
    ranks = len(order)
    theory = (f"(P-1)/(3M+P-1) = {p - 1}/{3 * m + p - 1} = {split_bubble(p, m):.3f} (1F1B: "
              f"{theoretical_bubble(p, m):.3f})" if ranks == p else
              f"(P-1)/(6M+P-1) with two chunks per rank = {ranks - 1}/{6 * m + ranks - 1} = "
              f"{split_bubble(ranks, m, 2):.3f} (1F1B: "
              f"{theoretical_bubble(ranks, m):.3f})")
    return "\n".join([
        f"bubble fraction: theory {theory}; simulated (F = I = W = 1 step per chunk) = "
        f"{timeline.bubble_fraction():.3f}",
        f"idle steps inside each {per}'s span (not hidden by overlapping steps): "
        + ", ".join(f"{per} {r}: {idle[r]:g}" for r in sorted(idle)),
        peak_line + " (a split backward holds them until its W)"])
