"""PipeDream's hierarchical partition optimizer (Narayanan et al., SOSP'19), reproduced.

The dynamic programme of msr-fiddle/pipedream's optimizer_graph_hierarchical.py over
contiguous ranges of states (`planner.antichains`) and worker counts. A stage of states
[a..b] on r workers costs (C + 4 (r-1) P / (B r)) / r: its forward+backward seconds C
plus a data-parallel weight sync of its P parameter bytes at B bytes/s, shared by the r
replicas. With an activation compression ratio c, every stage but the first also pays
2 A_in / (B r c) for its input and 2 A_out / (B r c) for its output (none after the last
layer); without one, transfers are ignored. The objective is the slowest stage: the
pipeline's seconds per minibatch of the profile. Levels nest: level 0's workers sit
inside each of level 1's (e.g. GPUs in a server, servers on a network), and a level's
range times come from the level below, as in PipeDream's `-n 8 4 -b <bw0> <bw1>`.

PipeDream's rules are kept as they are, including two oddities: above level 0 a range
kept as one stage divides its sync by the workers inside each unit but an added last
stage does not; and with a memory limit a stage stashes (activations + P) times
ceil(workers after it / r). Ties keep the first candidate in this order: one stage,
then the earliest split, then the fewest replicas on the last stage (PipeDream's order
where its Python set of split points iterates by index; there it is not fixed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from approxdist.errors import ConfigError
from approxdist.planner.antichains import StateSpace

_Entry = tuple[float, tuple[int, int] | None, int]  # (seconds, (split, workers before), replicas)
_Table = list[list[list[_Entry | None]]]              # [first state][last state][workers - 1]


@dataclass(frozen=True)
class Level:
    """`workers` units joined at `bandwidth` bytes/s (one of PipeDream's -n / -b pairs)."""

    workers: int
    bandwidth: float = 1e9

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError(f"level workers = {self.workers!r} must be an integer >= 1")
        if not isinstance(self.bandwidth, (int, float)) or not 0 < self.bandwidth < math.inf:
            raise ConfigError(f"level bandwidth = {self.bandwidth!r} must be a finite number of "
                              "bytes/s > 0 (1 GB/s is 1e9)")


@dataclass(frozen=True)
class PipeDreamSettings:
    """PipeDream's options: `levels` (innermost first), `--activation_compression_ratio`,
    `--straight_pipeline`, `--use_memory_constraint --memory_size` (as `memory_bytes`)
    and `--use_fewer_machines`."""

    levels: tuple[Level, ...]
    activation_compression_ratio: float | None = None
    straight_pipeline: bool = False
    memory_bytes: float | None = None
    use_fewer_workers: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.levels, tuple) or not self.levels or \
                not all(isinstance(level, Level) for level in self.levels):
            raise ConfigError(f"levels = {self.levels!r} must be a non-empty tuple of Level, "
                              "e.g. (Level(4, 1e9),)")
        for name in ("activation_compression_ratio", "memory_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or not value > 0):
                raise ConfigError(f"{name} = {value!r} must be a number > 0, or None for off")

    @property
    def workers(self) -> int:
        return math.prod(level.workers for level in self.levels)


@dataclass(frozen=True)
class PlannedStage:
    """States [first, end) (PipeDream's printed split) on `replicas` workers in all."""

    first: int
    end: int
    replicas: int
    layers: tuple[str, ...]
    compute_s: float        # forward + backward on one worker, before replication
    param_bytes: float


@dataclass(frozen=True)
class PipeDreamPlan:
    """The optimizer's answer: stages in order and the pipeline's seconds per minibatch."""

    stages: tuple[PlannedStage, ...]
    bottleneck_s: float      # slowest stage under PipeDream's objective
    single_worker_s: float   # the whole model's forward + backward on one worker
    data_parallel_s: float   # PipeDream's estimate for all workers data-parallel
    workers: int

    @property
    def workers_used(self) -> int:
        return sum(stage.replicas for stage in self.stages)


def optimize(space: StateSpace, settings: PipeDreamSettings) -> PipeDreamPlan:
    """The best plan for `space` under PipeDream's objective (`ConfigError` if none exists)."""
    n, within = len(space.states), 1
    tables: list[_Table] = []
    compute: list[list[float | None]] | None = None  # above level 0: the level below's times
    for number, level in enumerate(settings.levels):
        final = number == len(settings.levels) - 1
        table = _level_table(space, settings, level, within, compute, final)
        tables.append(table)
        compute = [[None if cell[-1] is None else cell[-1][0] for cell in row] for row in table]
        within = level.workers
    best = tables[-1][0][n - 1][settings.levels[-1].workers - 1]
    if best is None:
        raise ConfigError(
            f"no PipeDream plan for {n} state(s) on {settings.workers} worker(s) with these "
            "settings; a straight pipeline needs at least as many states as workers, and "
            "memory_bytes must hold the stashed data: use fewer workers, use_fewer_workers, "
            "or more memory")
    ranges = [(0, n, 1)]
    for table, level in zip(reversed(tables), reversed(settings.levels)):
        ranges = [(a, b, outer * r) for start, end, outer in ranges
                  for a, b, r in _splits(table, start, end, level.workers)]
    stages = tuple(_stage(space, a, b, r) for a, b, r in ranges)
    return PipeDreamPlan(stages, best[0], space.states[-1].compute_s,
                         _data_parallel_s(space, settings), settings.workers)


def _level_table(space: StateSpace, s: PipeDreamSettings, level: Level, within: int,
                 below: list[list[float | None]] | None, final: bool) -> _Table:
    """PipeDream's `compute_partitioning` for one level: A[i][j][m] is the best time of
    states [i..j] on m+1 workers; the last level fills only i = 0 (the whole model)."""
    n, workers, bw = len(space.states), level.workers, level.bandwidth
    span = _Spans(space, below)
    table: _Table = [[[None] * workers for _ in range(n)] for _ in range(n + 1)]
    for i in range(n + 1):
        for j in range(i, n):
            for m in range(1 if s.straight_pipeline else workers):
                stash = math.ceil((workers - (m + 1)) / (m + 1)) * (span.act(i, j) + span.par(i, j))
                time = span.compute(i, j)
                if (s.memory_bytes is not None and stash > s.memory_bytes) or time is None:
                    continue
                sync = 4 * m * span.par(i, j) / (bw * (m + 1)) / within
                table[i][j][m] = ((time + sync) / (m + 1), None, m + 1)
    for i in range(1 if final else n + 1):
        for m in range(1, workers):
            for j in range(i + 1, n):
                table[i][j][m] = _best_split(space, s, level, span, table, i, j, m)
    return table


def _best_split(space: StateSpace, s: PipeDreamSettings, level: Level, span: _Spans,
                table: _Table, i: int, j: int, m: int) -> _Entry | None:
    """Best of: states [i..j] as one stage, fewer workers (if allowed), or the best plan
    of [i..k] on m+1-r workers followed by a last stage [k+1..j] on r workers."""
    n, bw, ratio = len(space.states), level.bandwidth, s.activation_compression_ratio
    best = table[i][j][m]
    fewer = table[i][j][m - 1]
    if s.use_fewer_workers and fewer is not None and (best is None or fewer[0] < best[0]):
        best = fewer
    for k in sorted(space.states[j].predecessors):
        if i > 0 and k in space.states[i - 1].predecessors:
            continue
        last_compute = span.compute(k + 1, j)
        if last_compute is None:
            continue
        for r in range(1, 2 if s.straight_pipeline else m + 1):
            stash = (span.act(k + 1, j) + span.par(k + 1, j)) * math.ceil((level.workers - (m + 1)) / r)
            before = table[i][k][m - r]
            if (s.memory_bytes is not None and stash > s.memory_bytes) or before is None:
                continue
            par = span.par(k + 1, j)
            time = max(before[0], (last_compute + 4 * (r - 1) * par / (bw * r)) / r)
            if ratio is not None:
                time = max(time, 2.0 * space.states[k].output_bytes / (bw * r) / ratio)
                if j < n - 1:
                    time = max(time, 2.0 * space.states[j].output_bytes / (bw * r) / ratio)
            if best is None or time < best[0]:
                best = (time, (k, m - r), r)
    return best


class _Spans:
    """Totals of states [i..j] (PipeDream's compute_times / activation_sizes /
    parameter_sizes); above level 0, a range's time is the level below's best."""

    def __init__(self, space: StateSpace, below: list[list[float | None]] | None) -> None:
        self.below = below
        self._compute = [state.compute_s for state in space.states]
        self._act = [state.activation_bytes for state in space.states]
        self._par = [state.param_bytes for state in space.states]

    def compute(self, i: int, j: int) -> float | None:
        if self.below is not None:
            return self.below[i][j]
        return _diff(self._compute, i, j) if j >= i else None

    def act(self, i: int, j: int) -> float:
        return _diff(self._act, i, j)

    def par(self, i: int, j: int) -> float:
        return _diff(self._par, i, j)


def _diff(cumulative: list[float], i: int, j: int) -> float:
    return cumulative[j] - cumulative[i - 1] if i > 0 else cumulative[j]


def _splits(table: _Table, start: int, end: int, workers: int) -> list[tuple[int, int, int]]:
    """PipeDream's `analyze_partitioning`: follow the split pointers back from the last
    stage; (first, end, replicas) per stage of states [start, end)."""
    entry = table[start][end - 1][workers - 1]
    assert entry is not None  # the caller checked the whole model, and ranges come from it
    stages, end_of_stage = [], end
    while entry[1] is not None:
        (k, rest), replicas = entry[1], entry[2]
        stages.append((k + 1, end_of_stage, replicas))
        end_of_stage = k + 1
        entry = table[start][k][rest]
        assert entry is not None
    stages.append((start, end_of_stage, entry[2]))
    return stages[::-1]


def _stage(space: StateSpace, first: int, end: int, replicas: int) -> PlannedStage:
    spans = _Spans(space, None)
    compute = spans.compute(first, end - 1)
    assert compute is not None
    return PlannedStage(first, end, replicas, space.layers_between(first, end), compute,
                        spans.par(first, end - 1))


def _data_parallel_s(space: StateSpace, s: PipeDreamSettings) -> float:
    """PipeDream's data-parallel baseline: every worker holds the whole model."""
    time, params, within = space.states[-1].compute_s, space.states[-1].param_bytes, 1
    for level in s.levels:
        sync = 4 * (level.workers - 1) * params / (level.bandwidth * level.workers) / within
        time = (time + sync) / level.workers
        within = level.workers
    return time
