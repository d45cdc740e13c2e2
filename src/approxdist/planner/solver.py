"""The partition solver: a dynamic programme over block ranges and worker counts on our cost model.

PipeDream's optimizer (`pipedream_optimizer`, Narayanan et al., SOSP'19) fills a table
over (contiguous range of layers, workers) and keeps, per cell, the one plan with the
smallest slowest stage: O(L^2 N^2) for L blocks and N workers. Our objective
(`objective.estimate`: steady state + fill and drain + weight sync, codecs on every
wire, memory per rank) is not a single maximum, so each cell keeps the plans no other
plan of the cell beats on every part (a Pareto front) instead of one; the structure and
the O(L^2 N^2) transitions are PipeDream's.

The table runs over suffixes: cell (i, w) holds plans of blocks [i, L) on the last w
ranks (stage-major placement puts them at ranks N - w .. N - 1, so every cut's link
level is known), and a plan of the cell is a first stage [i, j) on r ranks followed by a
plan of cell (j, w - r). Building from the back also tells each new first stage how many
stages follow it, which sets its activations in flight under 1F1B (`objective.in_flight`):
so the memory limit is exact. A partial plan keeps the slowest steady-state term after
its first stage, the first stage's busy time without its incoming cut (known only when a
stage is put in front), the fill-and-drain sum, the largest all-reduce, its stage count
and its first stage's replicas (which set the next cut's link level and pairs). Plans
differing only in the last two are kept apart; otherwise a plan no better on every other
part is dropped: the objective grows with each of them, so the front holds the optimum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from approxdist.errors import ConfigError
from approxdist.planner.cost.links import LinkLevel
from approxdist.planner.cost.pipeline import (
    Boundary,
    Stage,
    accumulate_s,
    boundary,
    replica_allreduce_s,
)
from approxdist.planner.objective import (
    Estimate,
    SolverSettings,
    link_s,
    stage_bytes,
    steady_term,
)
from approxdist.planner.profile import Profile


@dataclass(frozen=True)
class Candidate:
    """One plan the solver found and its objective."""

    stages: tuple[Stage, ...]
    estimate: Estimate


@dataclass(frozen=True)
class _Partial:
    """A plan of a suffix (see the module docstring)."""

    steady_rest: float
    t_first: float
    fill: float
    sync: float
    count: int
    stages: tuple[Stage, ...]

    def beats(self, other: _Partial) -> bool:
        """No worse on every part."""
        return (self.steady_rest <= other.steady_rest and self.t_first <= other.t_first
                and self.fill <= other.fill and self.sync <= other.sync
                and self.count <= other.count)

    def finish(self, s: SolverSettings) -> Estimate:
        first = steady_term(s, self.stages[0].replicas, self.count, self.t_first, self.fill)
        return Estimate(max(self.steady_rest, first), self.fill, self.sync)

    def bound(self, s: SolverSettings) -> float:
        """The objective if this suffix were the whole plan (to rank a front past its limit)."""
        return self.finish(s).step_s


def solve(profile: Profile, settings: SolverSettings) -> list[Candidate]:
    """The `settings.keep` best plans by the objective, best first; `ConfigError` naming the
    limit when none exists."""
    _check_shape(profile, settings)
    table = _Table(profile, settings)
    n, world = len(profile.blocks), settings.world_size
    for i in range(n - 1, -1, -1):
        for w in range(1, world + 1):
            table.fill(i, w)
    final = [p for p in table.cells.get((0, world), [])
             if settings.stages is None or p.count == settings.stages]
    if not final:
        raise ConfigError(_no_plan(profile, settings))
    ranked = sorted(final, key=lambda p: (p.finish(settings).step_s, p.count, _shape(p.stages)))
    return [Candidate(p.stages, p.finish(settings)) for p in ranked[:settings.keep]]


class _Table:
    """The cells of the programme and the cost pieces they share (cached)."""

    def __init__(self, profile: Profile, settings: SolverSettings) -> None:
        self.profile, self.s = profile, settings
        self.busy = settings.network.busy(settings.world_size)
        self.cells: dict[tuple[int, int], list[_Partial]] = {}
        self._compute, self._acc = [0.0], [0.0]
        for b in profile.blocks:
            self._compute.append(self._compute[-1] + b.compute_s)
            self._acc.append(self._acc[-1] + b.acc_s)
        self._cuts: dict[tuple[int, LinkLevel], Boundary] = {}
        self._syncs: dict[tuple[Stage, LinkLevel], float] = {}
        self._levels: dict[tuple[int, int], LinkLevel] = {}

    def fill(self, i: int, w: int) -> None:
        n, world, m = len(self.profile.blocks), self.s.world_size, self.s.microbatches
        found: list[_Partial] = []
        for j in range(i + 1, n + 1):
            for r in range(1, min(w, m) + 1):
                stage, slots = Stage(i, j, r), range(world - w, world - w + r)
                if j == n:
                    if r == w:
                        found += self._last(stage, slots)
                    continue
                for rest in self.cells.get((j, w - r), []):
                    found += self._prepend(stage, slots, rest)
        front = _pareto(found, by_count=self.s.stages is not None)
        if len(front) > self.s.front:
            front = sorted(front, key=lambda p: (p.bound(self.s), _shape(p.stages)))[:self.s.front]
        self.cells[(i, w)] = front

    def _last(self, stage: Stage, slots: range) -> list[_Partial]:
        if not self._fits(stage, 1):
            return []
        t = self._busy(stage)
        return [_Partial(0.0, t, t, self._sync(stage, slots), 1, (stage,))]

    def _prepend(self, stage: Stage, slots: range, rest: _Partial) -> list[_Partial]:
        count = rest.count + 1
        if (self.s.stages is not None and count > self.s.stages) or not self._fits(stage, count):
            return []
        nxt = rest.stages[0]
        level = self._level(slots.start, slots.stop + nxt.replicas)
        cut = self._cut(stage.end, level)
        m = self.s.microbatches
        incoming = cut.decode_act + cut.encode_grad
        t_next = rest.t_first + incoming
        t = self._busy(stage) + cut.encode_act + cut.decode_grad
        link = (math.ceil(m / math.lcm(stage.replicas, nxt.replicas)) - 1) \
            * link_s(self.s, cut)
        steady = max(rest.steady_rest, link, steady_term(self.s, nxt.replicas, rest.count,
                                                         t_next, rest.fill + incoming))
        fill = rest.fill + cut.decode_act + cut.encode_grad + t + cut.act_wire \
            + cut.act_latency + cut.grad_wire + cut.grad_latency
        sync = max(rest.sync, self._sync(stage, slots))
        return [_Partial(steady, t, fill, sync, count, (stage, *rest.stages))]

    def _busy(self, stage: Stage) -> float:
        """Forward + backward seconds of one micro-batch on `stage`, accumulating included."""
        acc = self._acc[stage.end] - self._acc[stage.first]
        return self._compute[stage.end] - self._compute[stage.first] \
            + accumulate_s(acc, stage.replicas, self.s.microbatches)

    def _level(self, start: int, stop: int) -> LinkLevel:
        """The level joining ranks start .. stop - 1."""
        if (start, stop) not in self._levels:
            self._levels[(start, stop)] = self.s.network.level(range(start, stop))
        return self._levels[(start, stop)]

    def _fits(self, stage: Stage, stages_from_here: int) -> bool:
        limit = self.s.memory_bytes
        return limit is None or stage_bytes(self.profile, stage, stages_from_here, self.s) <= limit

    def _cut(self, cut: int, level: LinkLevel) -> Boundary:
        if (cut, level) not in self._cuts:
            self._cuts[(cut, level)] = boundary(self.profile, cut, level, self.busy,
                                                self.s.fwd_codec, self.s.bwd_codec)
        return self._cuts[(cut, level)]

    def _sync(self, stage: Stage, slots: range) -> float:
        key = (stage, self._level(slots.start, slots.stop))
        if key not in self._syncs:
            self._syncs[key] = replica_allreduce_s(self.profile, stage, key[1], self.s.algorithm,
                                                   self.s.grad_codec, self.busy)
        return self._syncs[key]


def _pareto(plans: list[_Partial], by_count: bool) -> list[_Partial]:
    """The plans no other plan with the same first-stage replicas (and, for a fixed stage
    count, the same count) beats on every part."""
    kept: dict[tuple[int, int], list[_Partial]] = {}
    for p in sorted(plans, key=lambda q: (q.fill, q.steady_rest, q.t_first, q.sync, q.count,
                                          _shape(q.stages))):
        group = kept.setdefault((p.stages[0].replicas, p.count if by_count else 0), [])
        if not any(q.beats(p) for q in group):
            group.append(p)
    return [p for group in kept.values() for p in group]


def _shape(stages: tuple[Stage, ...]) -> tuple[tuple[int, int, int], ...]:
    """Stages as sortable tuples (ties between equal objectives: fewer, earlier stages)."""
    return tuple((st.first, st.end, st.replicas) for st in stages)


def _check_shape(profile: Profile, s: SolverSettings) -> None:
    n = len(profile.blocks)
    if s.stages is not None and s.stages > n:
        raise ConfigError(f"{s.stages} stages for a model of {n} blocks ({profile.model}); use "
                          f"1..{n} stages (each stage holds at least one block)")
    if s.stages is not None and s.stages > s.world_size:
        raise ConfigError(f"{s.stages} stages need at least {s.stages} ranks, the world size is "
                          f"{s.world_size}; use --stages <= {s.world_size} or more ranks")


def _no_plan(profile: Profile, s: SolverSettings) -> str:
    """Why no plan exists: the memory limit (naming the block that alone needs the most)."""
    worst = max(range(len(profile.blocks)),
                key=lambda b: stage_bytes(profile, Stage(b, b + 1), 1, s))
    need = stage_bytes(profile, Stage(worst, worst + 1), 1, s)
    if s.memory_bytes is not None and need > s.memory_bytes:
        return (f"no plan of {profile.model} on {s.world_size} rank(s) fits --memory "
                f"{s.memory_bytes} bytes per rank: block {worst} "
                f"({profile.blocks[worst].name!r}) alone needs {need} bytes (parameters, "
                f"gradients, {s.optimizer} state, one micro-batch's stash); give more memory "
                f"or profile a smaller micro-batch")
    return (f"no plan of {profile.model} on {s.world_size} rank(s) with "
            f"{s.stages or 'any number of'} stage(s) and {s.microbatches} micro-batch(es) "
            f"fits {s.memory_bytes or 'unlimited'} bytes per rank with every replica given a "
            f"micro-batch; use more micro-batches, more memory or fewer ranks")
