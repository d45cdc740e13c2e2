"""Point-to-point time of one message through our link layer against gloo's own send/recv.

`measure_rank` runs on two ranks (via `run_on_ranks`). For each size, a round is a
ping-pong of that many bytes of fp32 values between ranks 0 and 1 through each engine in
turn (interleaved, alternating order, a barrier before each): `native` is
`dist.send`/`dist.recv` of the raw tensor, `approxdist` is `Link.isend`/`Link.irecv` with
the codec asked for (exact fp32 goes without codec copies, `comm/raw.py`) over the
emulated link, if any. Rank 0 times the round trip; half of it is one message's one-way
time, the median of the rounds is the row's `median_s`: the p2p table the cost model's
calibration takes (`fit_level`'s `p2p_rows`: `size_bytes`, `median_s`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from approxdist.bench.stats import median, p10
from approxdist.comm.codecs import Codec, get_codec
from approxdist.comm.link import Link
from approxdist.launch.context import DistContext

ENGINES = ("native", "approxdist")


@dataclass(frozen=True)
class P2PPlan:
    sizes: tuple[int, ...]
    codec: str = "fp32"
    link: str | None = None
    rounds: int = 20
    warmup: int = 2


def _native(ctx: DistContext, x: torch.Tensor, buf: torch.Tensor) -> None:
    peer = 1 - ctx.rank
    if ctx.rank == 0:
        dist.send(x, peer)
        dist.recv(buf, peer)
    else:
        dist.recv(buf, peer)
        dist.send(buf, peer)


def _ours(ctx: DistContext, link: Link, x: torch.Tensor, codec: Codec) -> None:
    peer = link.group.member(1 - ctx.rank)
    if ctx.rank == 0:
        link.isend(x, peer, codec, describe=False).wait()
        link.irecv(peer, x.numel(), codec).wait()
    else:
        got = link.irecv(peer, x.numel(), codec).wait()
        link.isend(got, peer, codec, describe=False).wait()


def measure_rank(ctx: DistContext, plan: P2PPlan) -> dict[tuple[str, int], list[float]]:
    """One-way seconds (half a round trip) per (engine, size); rank 0's are the times."""
    link, codec = Link(ctx, plan.link), get_codec(plan.codec)  # one codec, as a user keeps it
    out: dict[tuple[str, int], list[float]] = {}
    try:
        for size in plan.sizes:
            x = torch.randn(size // 4)
            buf = torch.empty_like(x)
            ops = {"native": partial(_native, ctx, x, buf),
                   "approxdist": partial(_ours, ctx, link, x, codec)}
            for op in ops.values():
                for _ in range(plan.warmup):
                    op()
            for r in range(plan.rounds):
                for name in (ENGINES if r % 2 == 0 else ENGINES[::-1]):
                    dist.barrier()
                    t0 = time.perf_counter()
                    ops[name]()
                    out.setdefault((name, size), []).append((time.perf_counter() - t0) / 2)
    finally:
        link.close()
    return out


def rows(times: dict[tuple[str, int], list[float]], plan: P2PPlan) -> list[dict[str, Any]]:
    """One row per engine and size (rank 0's times); `ratio_vs_native` for ours."""
    out = []
    for (engine, size), series in times.items():
        row: dict[str, Any] = {"engine": engine, "size_bytes": size, "median_s": median(series),
                               "p10_s": p10(series), "rounds": len(series),
                               "codec": plan.codec if engine == "approxdist" else "fp32",
                               "link": plan.link or "none", "world_size": 2}
        if engine == "approxdist":
            row["ratio_vs_native"] = row["median_s"] / median(times[("native", size)])
        out.append(row)
    return out
