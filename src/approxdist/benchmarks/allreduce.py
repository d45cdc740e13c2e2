"""All-reduce benchmark: measurement on each rank and the summary rows (seed 001, ANCHORS.md).

Method: every (algorithm, codec) pair is built once per rank; for each size they run
interleaved with `native` (fp32, the baseline) round after round, each op preceded by
a barrier and timed on every rank; an op's time is the slowest rank's. One warm-up
round per size sets the number of rounds (`budget_s` / round time, clamped to
[`min_repeats`, `max_repeats`]) so 64 MB on 4 ranks stays affordable. Bus bandwidth is
nccl-tests' `busbw = size / time * 2 (N-1) / N`, in GB/s (1e9 bytes/s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.distributed as dist

from approxdist.bench.report import Column, render
from approxdist.bench.stats import median, p10, paired_ratio, slowest
from approxdist.bench.timing import timed
from approxdist.comm.collectives.allreduce import AllReduce
from approxdist.comm.collectives.autocal import resolve
from approxdist.comm.collectives.calibration import Measurement
from approxdist.comm.link import Link
from approxdist.launch.context import DistContext

Combo = tuple[str, str]  # (algorithm, codec)
BASELINE: Combo = ("native", "fp32")


@dataclass(frozen=True)
class BenchPlan:
    """What one benchmark run measures (sent to every rank)."""

    sizes: tuple[int, ...]
    combos: tuple[Combo, ...]
    link: str | None = None
    calibration: str | None = None
    max_repeats: int = 100
    min_repeats: int = 5
    budget_s: float = 6.0


@dataclass
class Row:
    algorithm: str
    codec: str
    size_bytes: int
    world_size: int
    median_s: float
    p10_s: float
    busbw_gbps: float
    ratio_vs_native: float | None
    link: str = "none"
    repeats: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "extra"}
        out.update(self.extra)
        return out

    @staticmethod
    def from_json(raw: dict[str, Any]) -> Row:
        """The row `as_json` (`bench allreduce --json`) wrote; other keys go to `extra`."""
        named = {f.name for f in fields(Row)} - {"extra"}
        return Row(**{k: v for k, v in raw.items() if k in named},
                   extra={k: v for k, v in raw.items() if k not in named})


def _max_across(ctx: DistContext, value: float) -> float:
    if ctx.world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _timed(ctx: DistContext, reduce: AllReduce, work: torch.Tensor, src: torch.Tensor) -> float:
    work.copy_(src)
    if ctx.world_size > 1:
        dist.barrier()
    return timed(lambda: reduce(work))


def measure_rank(ctx: DistContext, plan: BenchPlan) -> dict[tuple[str, str, int], list[float]]:
    """Run on every rank (via `run_on_ranks`); this rank's times per (algorithm, codec, size)."""
    torch.manual_seed(1234 + ctx.rank)
    link = Link(ctx, plan.link)
    # auto reads --calibration, else the cached calibration, measured now on first use
    calibration = resolve(link, plan.calibration) if any(a == "auto" for a, _ in plan.combos) \
        else plan.calibration
    reducers = {c: AllReduce(link, c[0], c[1], calibration=calibration) for c in plan.combos}
    times: dict[tuple[str, str, int], list[float]] = {}
    try:
        for size in plan.sizes:
            src = torch.randn(size // 4)
            work = torch.empty_like(src)
            warm = sum(_timed(ctx, r, work, src) for r in reducers.values())
            rounds = plan.budget_s / max(_max_across(ctx, warm), 1e-9)
            rounds = int(min(max(rounds, plan.min_repeats), plan.max_repeats))
            for combo in plan.combos:
                times[(combo[0], combo[1], size)] = []
            for _ in range(rounds):
                for combo, reduce in reducers.items():
                    times[(combo[0], combo[1], size)].append(_timed(ctx, reduce, work, src))
            del src, work
    finally:
        link.close()
    return times


def _slowest(per_rank: Sequence[dict[tuple[str, str, int], list[float]]],
             key: tuple[str, str, int]) -> list[float]:
    """The slowest rank's time of each repetition."""
    return slowest([r[key] for r in per_rank])


def summarize(per_rank: Sequence[dict[tuple[str, str, int], list[float]]], world: int,
              link: str | None) -> list[Row]:
    """Rows (slowest rank per repetition -> median, p10, busbw, ratio to native).

    `extra["paired_ratio"]` is the median over rounds of (time / native's time in the
    same round): robust to load that drifts during the run; calibration picks by it.
    """
    rows: list[Row] = []
    for alg, codec, size in per_rank[0]:
        series = _slowest(per_rank, (alg, codec, size))
        med = median(series)
        bus = size / med * (2 * (world - 1) / world) / 1e9 if world > 1 else 0.0
        row = Row(alg, codec, size, world, med, p10(series), bus, None, link or "none",
                  len(series))
        base_key = (*BASELINE, size)
        if base_key in per_rank[0]:
            base = _slowest(per_rank, base_key)
            row.extra["paired_ratio"] = paired_ratio(series, base)
            row.ratio_vs_native = med / median(base)
        rows.append(row)
    return rows


def measurements(rows: Sequence[Row], codec: str) -> list[Measurement]:
    """Calibration inputs: medians (and paired ratios) of every algorithm with `codec`."""
    return [Measurement(r.algorithm, r.size_bytes, r.median_s, r.extra.get("paired_ratio"))
            for r in rows if r.codec == codec and r.algorithm != "auto"]


def fmt_size(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


COLUMNS = (Column("size", 6, show=lambda r: fmt_size(r["size_bytes"])),
           Column("algorithm", 9, "algorithm", left=True), Column("codec", 14, "codec", left=True),
           Column("median ms", 10, show=lambda r: f"{r['median_s'] * 1e3:.3f}"),
           Column("p10 ms", 9, show=lambda r: f"{r['p10_s'] * 1e3:.3f}"),
           Column("busbw GB/s", 10, "busbw_gbps", ".3f"), Column("x native", 8, "ratio_vs_native", ".2f"),
           Column("reps", 4, "repeats"))


def table(rows: Sequence[Row]) -> str:
    """A fixed-width table of the rows, grouped by size."""
    ordered = sorted(rows, key=lambda r: (r.size_bytes, r.codec != "fp32", r.algorithm != "native",
                                          r.codec, r.algorithm))
    return render(COLUMNS, [r.as_json() for r in ordered], rule=True)

