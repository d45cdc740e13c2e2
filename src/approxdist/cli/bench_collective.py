"""`approxdist bench collective`: our all-gather, reduce-scatter or broadcast vs torch.distributed's.

    approxdist bench collective --op allgather --world-size 4 --sizes 4K,64K,1M,16M
    approxdist bench collective --op reducescatter --algorithms ring,direct --codec bf16

Runs on N local gloo ranks (`run_on_ranks`), interleaves ours with torch.distributed's
op on the same group in the same run and prints median / p10 latency, bus bandwidth and
the ratios to `native` (method: `approxdist.benchmarks.collective`).
"""

from __future__ import annotations

import argparse
from typing import Any

from approxdist.bench.host import HostWatch
from approxdist.bench.report import add_json_flag, check_counts, finish
from approxdist.benchmarks.collective import OPS, CollectivePlan, measure_rank, rows, table
from approxdist.cli.bench_allreduce import add_sizes_flag, parse_sizes
from approxdist.cli.groups import command
from approxdist.comm.codecs import get_codec
from approxdist.comm.collectives import (
    BROADCAST_ALGORITHMS,
    GATHER_ALGORITHMS,
    SCATTER_ALGORITHMS,
)
from approxdist.comm.netem import parse_link
from approxdist.errors import ConfigError
from approxdist.launch.spawn import run_on_ranks
from approxdist.registry import Registry
from approxdist.text import name_list


def register(sub: Any) -> None:
    p = command(sub, "collective", help="all-gather, reduce-scatter, broadcast vs torch.distributed's",
                doc=__doc__)
    p.add_argument("--op", required=True, choices=OPS, help="the collective to measure")
    p.add_argument("--world-size", type=int, default=4, help="local ranks (default 4)")
    add_sizes_flag(p, "4K,64K,1M,16M",
                   "whole tensor in fp32 bytes (all-gather result, reduce-scatter input)")
    p.add_argument("--algorithms", default="auto",
                   help="comma list of ours: auto, direct and ring (all-gather, reduce-scatter) "
                        "or tree (broadcast) (default auto)")
    p.add_argument("--codec", default="fp32", help="our wire format (default fp32)")
    p.add_argument("--link", default=None,
                   help="emulated link for ours only (native cannot be shaped), e.g. bw=1gbit")
    p.add_argument("--rounds", type=int, default=40,
                   help="timed calls per engine and size (default %(default)s)")
    add_json_flag(p)
    p.set_defaults(func=run)


def parse_algorithms(op: str, text: str) -> tuple[str, ...]:
    """Our algorithms to run, each checked against the op's registry (`auto` too)."""
    names = tuple(dict.fromkeys(name_list(text)))
    registries: dict[str, Registry[Any]] = {
        "allgather": GATHER_ALGORITHMS, "reducescatter": SCATTER_ALGORITHMS,
        "broadcast": BROADCAST_ALGORITHMS}
    registry = registries[op]
    for name in names:
        if name != "auto":
            registry.get(name)
    if not names:
        raise ConfigError(f"--algorithms {text!r} names none; e.g. --algorithms auto,ring")
    return names


def run(args: argparse.Namespace) -> int:
    if args.world_size < 2:
        raise ConfigError(f"--world-size {args.world_size} must be >= 2 (a collective needs "
                          f"peers)")
    check_counts(rounds=args.rounds)
    link = parse_link(args.link)
    plan = CollectivePlan(args.op, parse_sizes(args.sizes), parse_algorithms(args.op,
                                                                              args.algorithms),
                          get_codec(args.codec).spec, link.spec if link else None, args.rounds)
    with HostWatch() as host:
        per_rank = run_on_ranks(measure_rank, args.world_size, plan, timeout_s=3600,
                                comm_timeout_s=300)
    out = rows(per_rank, plan, args.world_size)
    print(table(out))
    finish(host, out, args.json,
           f"approxdist bench collective --op {args.op} --world-size {args.world_size} "
           f"--sizes {args.sizes} --algorithms {','.join(plan.algorithms)} --codec {args.codec} "
           f"--rounds {args.rounds}" + (f" --link {args.link}" if args.link else ""))
    return 0
