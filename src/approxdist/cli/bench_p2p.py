"""`approxdist bench p2p`: one message between two ranks through our link layer vs gloo's send/recv.

    approxdist bench p2p --sizes 4K,64K,1M,16M --json p2p.json
    approxdist bench p2p --sizes 1M,16M --link bw=1gbit --codec bf16

Ping-pong between two local gloo ranks, interleaved with gloo's own send/recv of the same
tensor (`dist.send`/`recv`; method: `approxdist.benchmarks.p2p`); one-way time = half the round trip. The
rows of engine `approxdist` are the p2p table the cost model's calibration takes
(`planner.cost.fit_level(..., p2p_rows=...)`, docs/planner.md).
"""

from __future__ import annotations

import argparse
from typing import Any

from approxdist.bench.host import HostWatch
from approxdist.bench.report import Column, add_json_flag, check_counts, finish, render
from approxdist.benchmarks.p2p import P2PPlan, measure_rank, rows
from approxdist.cli.bench_allreduce import add_sizes_flag, parse_sizes
from approxdist.cli.groups import command
from approxdist.comm.codecs import get_codec
from approxdist.comm.netem import parse_link
from approxdist.launch.spawn import run_on_ranks

COLUMNS = (Column("engine", 11, "engine", left=True), Column("codec", 6, "codec", left=True),
           Column("size", 10, "size_bytes"),
           Column("median us", 11, show=lambda r: f"{r['median_s'] * 1e6:.1f}"),
           Column("p10 us", 10, show=lambda r: f"{r['p10_s'] * 1e6:.1f}"),
           Column("GB/s", 7, show=lambda r: f"{r['size_bytes'] / r['median_s'] / 1e9:.2f}"),
           Column("vs native", 9, show=lambda r: f"{r['ratio_vs_native']:.2f}x"
                  if "ratio_vs_native" in r else "-"))


def register(sub: Any) -> None:
    p = command(sub, "p2p", help="one message: our link layer vs gloo send/recv", doc=__doc__)
    add_sizes_flag(p, "4K,64K,1M,4M,16M")
    p.add_argument("--codec", default="fp32", help="our wire format (default fp32: raw)")
    p.add_argument("--link", default=None, help="emulated link of ours, e.g. bw=1gbit,lat=100us")
    p.add_argument("--rounds", type=int, default=20, help="ping-pongs per size and engine")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_counts(rounds=args.rounds)
    link = parse_link(args.link)
    plan = P2PPlan(parse_sizes(args.sizes), get_codec(args.codec).spec,
                   link.spec if link else None, args.rounds)
    with HostWatch() as host:
        out = rows(run_on_ranks(measure_rank, 2, plan, timeout_s=3600)[0], plan)
    print(render(COLUMNS, out))
    finish(host, out, args.json,
           f"approxdist bench p2p --sizes {args.sizes} --codec {args.codec} --rounds "
           f"{args.rounds}" + (f" --link {args.link}" if args.link else ""))
    return 0
