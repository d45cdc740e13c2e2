"""All-gather, reduce-scatter and broadcast benchmark: ours against torch.distributed's in one run.

Method (as `benchmarks/allreduce.py`): every engine is built once per rank; for each
size, after `warmup` untimed calls of each, `rounds` rounds run every engine once in
turn, the order reversed every other round, a barrier before each call; every rank times
its call and a call's time is the slowest rank's. Engines: `native` is torch.distributed's
op on the same group (`all_gather_single` = `all_gather_into_tensor`,
`reduce_scatter_single` = `reduce_scatter_tensor`, `broadcast` from member 0), into
buffers made once; ours are `AllGather` / `ReduceScatter` / `Broadcast` with each asked
algorithm and the codec (all-gather into a reused `out=` as native does).

A size is the whole tensor in fp32 bytes, as nccl-tests count it: the all-gather's
result, the reduce-scatter's input, the broadcast tensor, rounded down to a multiple of
the world size in values (each member's block is size / n). Bus bandwidth is
nccl-tests' busbw: size / time * (n-1)/n for all-gather and reduce-scatter, size / time
for broadcast, in GB/s (1e9 bytes/s).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from approxdist.bench.report import Column, render
from approxdist.bench.stats import median, p10, paired_ratio, slowest
from approxdist.bench.timing import timed
from approxdist.benchmarks.allreduce import fmt_size
from approxdist.comm.collectives import AllGather, Broadcast, ReduceScatter
from approxdist.comm.link import Link
from approxdist.launch.context import DistContext

OPS = ("allgather", "reducescatter", "broadcast")
NATIVE = "native"
Op = Callable[[], object]
Key = tuple[str, int]  # (engine, size)


@dataclass(frozen=True)
class CollectivePlan:
    """What one run measures (sent to every rank)."""

    op: str
    sizes: tuple[int, ...]
    algorithms: tuple[str, ...] = ("auto",)
    codec: str = "fp32"
    link: str | None = None
    rounds: int = 40
    warmup: int = 2


def values(size: int, world: int) -> int:
    """fp32 values of a `size`-byte tensor, rounded down to a multiple of `world`."""
    return max(world, size // 4 // world * world)


def _engines(ctx: DistContext, link: Link, plan: CollectivePlan, n: int) -> dict[str, Op]:
    """One call per engine on tensors of `n` values in all (made once, reused)."""
    world, pg = link.world_size, link.group.pg
    gen = torch.Generator().manual_seed(1234 + ctx.rank)
    ops: dict[str, Op] = {}
    if plan.op == "allgather":
        x, out = torch.randn(n // world, generator=gen), torch.empty(n)
        ops[NATIVE] = lambda: dist.all_gather_single(out, x, group=pg)
        for a in plan.algorithms:
            ops[a] = partial(AllGather(link, plan.codec, algorithm=a), x, out=out)
    elif plan.op == "reducescatter":
        x, out = torch.randn(n, generator=gen), torch.empty(n // world)
        ops[NATIVE] = lambda: dist.reduce_scatter_single(out, x, group=pg)
        for a in plan.algorithms:
            ops[a] = partial(ReduceScatter(link, plan.codec, algorithm=a), x)
    else:
        x = torch.randn(n, generator=gen)
        root = link.group.global_rank(0)  # member 0 is the root of both
        ops[NATIVE] = lambda: dist.broadcast(x, src=root, group=pg)
        for a in plan.algorithms:
            ops[a] = partial(Broadcast(link, plan.codec, algorithm=a), x, 0)
    return ops


def measure_rank(ctx: DistContext, plan: CollectivePlan) -> dict[Key, list[float]]:
    """Run on every rank (via `run_on_ranks`); this rank's seconds per (engine, size)."""
    link = Link(ctx, plan.link)
    times: dict[Key, list[float]] = {}
    try:
        for size in plan.sizes:
            ops = _engines(ctx, link, plan, values(size, link.world_size))
            for op in ops.values():
                for _ in range(plan.warmup):
                    dist.barrier()
                    op()
            names = list(ops)
            for r in range(plan.rounds):
                for name in (names if r % 2 == 0 else names[::-1]):
                    dist.barrier()
                    times.setdefault((name, size), []).append(timed(ops[name]))
    finally:
        link.close()
    return times


def rows(per_rank: Sequence[dict[Key, list[float]]], plan: CollectivePlan,
         world: int) -> list[dict[str, Any]]:
    """One row per engine and size: the slowest rank per round -> median, p10, busbw, and
    the ratios to native (of the medians, and the paired ratio: median of per-round ratios)."""
    out = []
    for engine, size in per_rank[0]:
        series = slowest([r[(engine, size)] for r in per_rank])
        base = slowest([r[(NATIVE, size)] for r in per_rank])
        med = median(series)
        factor = 1.0 if plan.op == "broadcast" else (world - 1) / world
        row: dict[str, Any] = {
            "op": plan.op, "engine": engine, "codec": plan.codec if engine != NATIVE else "fp32",
            "size_bytes": size, "world_size": world, "median_s": med, "p10_s": p10(series),
            "busbw_gbps": size / med * factor / 1e9, "rounds": len(series),
            "link": plan.link or "none"}
        if engine != NATIVE:
            row["ratio_vs_native"] = med / median(base)
            row["paired_ratio"] = paired_ratio(series, base)
        out.append(row)
    return out


COLUMNS = (Column("size", 6, show=lambda r: fmt_size(r["size_bytes"])),
           Column("engine", 8, "engine", left=True), Column("codec", 14, "codec", left=True),
           Column("median ms", 10, show=lambda r: f"{r['median_s'] * 1e3:.3f}"),
           Column("p10 ms", 9, show=lambda r: f"{r['p10_s'] * 1e3:.3f}"),
           Column("busbw GB/s", 10, "busbw_gbps", ".3f"),
           Column("x native", 8, "ratio_vs_native", ".2f"),
           Column("paired", 6, "paired_ratio", ".2f"), Column("rounds", 6, "rounds"))


def table(out: Sequence[dict[str, Any]]) -> str:
    """A fixed-width table of the rows, native first within each size."""
    ordered = sorted(out, key=lambda r: (r["size_bytes"], r["engine"] != NATIVE, r["engine"]))
    return render(COLUMNS, ordered, rule=True)
