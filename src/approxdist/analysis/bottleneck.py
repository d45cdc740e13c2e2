"""Bottleneck analysis of a merged trace (seed 002's timeline analysis), pure and testable.

Every instant of a rank's **window** (the union of its `step` spans; without any, the
span of the whole trace) is put in exactly one class, so the four fractions sum to 1:

* **compute**: a compute-class span (run_for, run_back, optimizer, data) is innermost on
  some thread of the rank (threads overlap: a rank computing while a communication
  thread all-reduces is computing);
* **comm**: not compute, and a comm-class span (encode, decode, send_*, receive_*,
  sync) is innermost on some thread: communication work the rank does itself;
* **waiting**: neither, while the rank is blocked on its links: an incoming transfer is
  in flight, or an outgoing one is while no posted receive of the rank still waits for
  its sender to send;
* **bubble**: the rest: idle time not attributable to communication; in a pipeline,
  a stage waiting for a neighbour that has not produced its data yet (fill and drain).
  In a data-parallel run it is untraced idle time.

Transfers are matched per directed link and lane (one lane per `Link` object) in
posting order (the k-th send src->dst with the k-th receive: the link's FIFO rule). A
pair is *in flight* from the send's post until the earlier of the two ends returned from
its wait (both are upper bounds of the arrival; transports buffer, so data moves before
the receive is posted), and *unsent* from the receive's post until the send's post.
When the two sides recorded different counts, each event's own interval counts as in
flight. Only transfers that overlap a step span of the rank that recorded them count
(`in_steps`): start-up, evaluation and checkpoint traffic stay out. Per link and
direction: bytes (sender's count), transfer time (union of the in-flight intervals) and
effective bandwidth (bytes / time: a lower bound of the link's rate, as a late receiver
lengthens the flight). The *slowest stage* is the rank with
the most compute + comm time per step; `stalls` say in which wait spans it
stood idle, `waits_on` how long each of its links was in flight while it waited. For
a pipeline run the measured bubble (mean over ranks) is set against the theory
(P-1)/(M+P-1) of GPipe and 1F1B, which assumes equal stages and free communication.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from approxdist.analysis.intervals import IntervalSet, self_time
from approxdist.pipeline.schedule.grid import theoretical_bubble
from approxdist.trace.errors import TraceError
from approxdist.trace.phases import COMM, COMPUTE, STEP_CLASS, TRANSFER, WAITING, phase_class


@dataclass(frozen=True)
class Span:
    rank: int
    tid: int
    name: str
    cls: str
    start: float
    end: float


@dataclass(frozen=True)
class Transfer:
    rank: int
    src: int
    dst: int
    nbytes: int
    start: float
    end: float
    lane: str = ""

    @property
    def is_send(self) -> bool:
        return self.rank == self.src


@dataclass(frozen=True)
class RankFigures:
    """Fractions of one rank's window; `stalls`/`waits_on` in seconds over the window."""

    rank: int
    window_s: float
    steps: int
    compute: float
    comm: float
    waiting: float
    bubble: float
    stalls: dict[str, float] = field(default_factory=dict)
    waits_on: dict[str, float] = field(default_factory=dict)

    @property
    def busy_per_step_s(self) -> float:
        return (self.compute + self.comm) * self.window_s / max(1, self.steps)


@dataclass(frozen=True)
class LinkFigures:
    src: int
    dst: int
    nbytes: int
    messages: int
    time_s: float
    matched: bool

    @property
    def bandwidth_bps(self) -> float:
        """Effective bandwidth in bytes per second (0 when no transfer time was seen)."""
        return self.nbytes / self.time_s if self.time_s > 0 else 0.0


@dataclass(frozen=True)
class BubbleFigures:
    stages: int
    microbatches: int
    theory: float
    measured: float
    idle: float


@dataclass(frozen=True)
class Analysis:
    ranks: list[RankFigures]
    links: list[LinkFigures]
    slowest: int | None
    bubble: BubbleFigures | None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for row, rank in zip(out["ranks"], self.ranks):
            row["busy_per_step_s"] = rank.busy_per_step_s
        for row, link in zip(out["links"], self.links):
            row["bandwidth_bytes_per_s"] = link.bandwidth_bps
        return out


def parse_events(trace: dict[str, Any]) -> tuple[list[Span], list[Transfer]]:
    """Spans and transfers (seconds) of a Chrome trace written by `trace.chrome`."""
    spans, transfers = [], []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X":
            continue
        start, end = ev["ts"] / 1e6, (ev["ts"] + ev["dur"]) / 1e6
        args = ev.get("args") or {}
        if ev.get("cat") == TRANSFER:
            transfers.append(Transfer(ev["pid"], int(args["src"]), int(args["dst"]),
                                      int(args.get("bytes", 0)), start, end,
                                      str(args.get("lane", ""))))
        else:
            cls = phase_class(ev["name"], ev.get("cat"))
            spans.append(Span(ev["pid"], ev["tid"], ev["name"], cls, start, end))
    return spans, transfers


@dataclass(frozen=True)
class _LinkTimes:
    """Per directed link: when data was in flight, and when the receiver had posted its
    receive but the sender had not yet sent (the receiver waits on the peer, not the link)."""

    flight: IntervalSet
    unsent: IntervalSet


def _match(ts: list[Transfer]) -> tuple[list[tuple[float, float]], list[tuple[float, float]],
                                       bool]:
    """(in-flight, unsent) intervals of one lane's transfers, and whether they matched."""
    sends = sorted((t for t in ts if t.is_send), key=lambda t: t.start)
    recvs = sorted((t for t in ts if not t.is_send), key=lambda t: t.start)
    if not sends or len(sends) != len(recvs):
        return [(t.start, t.end) for t in ts], [], False
    pairs = list(zip(sends, recvs))
    return ([(s.start, max(s.start, min(s.end, r.end))) for s, r in pairs],
            [(r.start, min(s.start, r.end)) for s, r in pairs], True)


def _link_times(transfers: list[Transfer]) -> tuple[dict[tuple[int, int], _LinkTimes],
                                                     list[LinkFigures]]:
    """In-flight intervals and figures per directed link (see the module docstring)."""
    lanes: dict[tuple[int, int], dict[str, list[Transfer]]] = defaultdict(
        lambda: defaultdict(list))
    for t in transfers:
        lanes[(t.src, t.dst)][t.lane].append(t)
    times, figures = {}, []
    for (src, dst), by_lane in sorted(lanes.items()):
        flight: list[tuple[float, float]] = []
        unsent: list[tuple[float, float]] = []
        matched, nbytes, messages = True, 0, 0
        for ts in by_lane.values():
            f, u, ok = _match(ts)
            flight, unsent, matched = flight + f, unsent + u, matched and ok
            counted = [t for t in ts if t.is_send] or ts
            nbytes, messages = nbytes + sum(t.nbytes for t in counted), messages + len(counted)
        times[(src, dst)] = _LinkTimes(IntervalSet.of(flight), IntervalSet.of(unsent))
        figures.append(LinkFigures(src, dst, nbytes, messages, times[(src, dst)].flight.length,
                                   matched))
    return times, figures


def _union(sets: list[IntervalSet]) -> IntervalSet:
    return IntervalSet.of(iv for s in sets for iv in s.spans)


def _classified(spans: list[Span]) -> tuple[dict[str, list[IntervalSet]],
                                            dict[str, list[IntervalSet]]]:
    """Self time per class, and per stall label ("wait in receive_back"), over threads."""
    by_class: dict[str, list[IntervalSet]] = defaultdict(list)
    stalls: dict[str, list[IntervalSet]] = defaultdict(list)
    by_tid: dict[int, list[Span]] = defaultdict(list)
    for s in spans:
        by_tid[s.tid].append(s)
    for group in by_tid.values():
        own = self_time([(s.start, s.end, i) for i, s in enumerate(group)])
        for i, (ivs, parent) in own.items():
            s = group[i]
            by_class[s.cls].append(ivs)
            if s.cls == WAITING:
                label = s.name if parent is None else f"{s.name} in {group[parent].name}"
                stalls[label].append(ivs)
    return by_class, stalls


def _waiting(rank: int, links: dict[tuple[int, int], _LinkTimes], idle: IntervalSet
             ) -> tuple[IntervalSet, dict[str, IntervalSet]]:
    """Idle time of `rank` attributable to its links, and each link's in-flight time."""
    incoming = [t for (a, b), t in links.items() if b == rank]
    outgoing = [t for (a, b), t in links.items() if a == rank]
    unsent = _union([t.unsent for t in incoming])
    blamed = _union([t.flight for t in incoming]) | (_union([t.flight for t in outgoing]) - unsent)
    waiting = blamed & idle
    return waiting, {f"{a}->{b}": t.flight for (a, b), t in sorted(links.items()) if rank in (a, b)}


def rank_figures(rank: int, spans: list[Span], links: dict[tuple[int, int], _LinkTimes],
                 default_window: IntervalSet) -> RankFigures:
    """The four fractions of one rank (its own spans only) over its window."""
    by_class, stall_sets = _classified(spans)
    steps = [s for s in spans if s.cls == STEP_CLASS]
    window = IntervalSet.of((s.start, s.end) for s in steps) if steps else default_window
    total = window.length
    if total <= 0:
        raise TraceError(f"rank {rank} has an empty analysis window; record spans around "
                         f"at least one step")
    compute = _union(by_class[COMPUTE]) & window
    comm = (_union(by_class[COMM]) & window) - compute
    idle = window - compute - comm
    waiting, mine = _waiting(rank, links, idle)
    bubble = idle - waiting
    return RankFigures(
        rank, total, len(steps), compute.length / total, comm.length / total,
        waiting.length / total, bubble.length / total,
        stalls={k: (_union(v) & idle).length for k, v in sorted(stall_sets.items())},
        waits_on={k: (f & waiting).length for k, f in mine.items()})


def skip_steps(spans: list[Span], transfers: list[Transfer], n: int
               ) -> tuple[list[Span], list[Transfer]]:
    """Drop each rank's first `n` step spans (warm-up) and the transfers posted before the
    earliest step kept on any rank."""
    if n <= 0:
        return spans, transfers
    dropped: set[int] = set()
    kept_starts = []
    for rank in sorted({s.rank for s in spans}):
        steps = sorted((s for s in spans if s.rank == rank and s.cls == STEP_CLASS),
                       key=lambda s: s.start)
        if len(steps) <= n:
            raise TraceError(f"rank {rank} traced {len(steps)} steps; skipping {n} leaves "
                             f"none (lower --skip-steps or trace more steps)")
        dropped.update(id(s) for s in steps[:n])
        kept_starts.append(steps[n].start)
    cutoff = min(kept_starts)
    return ([s for s in spans if id(s) not in dropped],
            [t for t in transfers if t.start >= cutoff])


def in_steps(spans: list[Span], transfers: list[Transfer]) -> list[Transfer]:
    """The transfers that overlap a step span of the rank that recorded them (a trainer
    also moves data outside its steps: shape exchange, evaluation); a rank without step
    spans keeps all of its transfers."""
    windows: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for s in spans:
        if s.cls == STEP_CLASS:
            windows[s.rank].append((s.start, s.end))
    merged = {r: IntervalSet.of(w).spans for r, w in windows.items()}
    ends = {r: [b for _, b in w] for r, w in merged.items()}

    def overlaps(t: Transfer) -> bool:
        if t.rank not in merged:
            return True
        i = bisect.bisect_left(ends[t.rank], t.start)  # first step ending at or after it
        return i < len(ends[t.rank]) and merged[t.rank][i][0] <= t.end

    return [t for t in transfers if overlaps(t)]


def analyze(trace: dict[str, Any], stages: int | None = None, microbatches: int | None = None,
            skip: int = 0) -> Analysis:
    """Fractions per rank, figures per link, slowest stage and (for pipelines) the bubble;
    `skip` leaves out each rank's first steps (see `skip_steps`), transfers outside the
    steps are left out (see `in_steps`)."""
    spans, transfers = skip_steps(*parse_events(trace), skip)
    transfers = in_steps(spans, transfers)
    if not spans:
        raise TraceError("the trace holds no spans; record phases with `rec.span(...)`")
    times, links = _link_times(transfers)
    everything = IntervalSet.of([(s.start, s.end) for s in spans]
                                + [(t.start, t.end) for t in transfers])
    default = IntervalSet.of([everything.bounds] if everything.bounds else [])
    per_rank: dict[int, list[Span]] = defaultdict(list)
    for s in spans:
        per_rank[s.rank].append(s)
    ranks = [rank_figures(r, per_rank[r], times, default) for r in sorted(per_rank)]
    slowest = max(ranks, key=lambda f: f.busy_per_step_s).rank if len(ranks) > 1 else None
    bubble = None
    if stages and microbatches and stages > 1:
        bubble = BubbleFigures(stages, microbatches, theoretical_bubble(stages, microbatches),
                               sum(f.bubble for f in ranks) / len(ranks),
                               sum(1 - f.compute for f in ranks) / len(ranks))
    return Analysis(ranks, links, slowest, bubble)
