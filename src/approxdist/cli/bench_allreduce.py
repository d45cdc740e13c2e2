"""`approxdist bench allreduce`: our all-reduce algorithms against `dist.all_reduce` (seed 001).

    approxdist bench allreduce --world-size 4 --sizes 4K,64K,1M,16M,64M --algorithms all \
        --codec fp32,bf16 --link bw=1gbit --json out.json

Runs on N local gloo ranks (`run_on_ranks`), interleaves every algorithm with `native`
in the same run and prints median / p10 latency, bus bandwidth and the ratio to
`native` (method: `approxdist.benchmarks.allreduce`). `--calibrate` fits `auto`'s
thresholds from the measured medians and writes them to `--calibration` (default
`allreduce-calibration.json`); when `auto` is asked for, everything is then measured
again in one run with `auto` reading that file. Without `--calibrate` or
`--calibration`, `auto` reads this machine's cached calibration and measures it first
when there is none (`comm/collectives/autocal.py`; its time is printed apart).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from approxdist.bench.host import HostWatch
from approxdist.bench.report import add_json_flag, finish
from approxdist.benchmarks.allreduce import (
    BASELINE,
    BenchPlan,
    Combo,
    Row,
    measure_rank,
    measurements,
    summarize,
    table,
)
from approxdist.cli.groups import command
from approxdist.comm.codecs import get_codec
from approxdist.comm.collectives import DEFAULT_PATH, algorithm_names, fit, get_algorithm
from approxdist.comm.netem import parse_link
from approxdist.errors import ConfigError
from approxdist.launch.context import init_from_env, shutdown
from approxdist.launch.spawn import run_on_ranks
from approxdist.text import name_list

_SIZE = re.compile(r"(\d+)([KMG]?)(I?B?)", re.IGNORECASE)
_SCALE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def register(sub: Any) -> None:
    p = command(sub, "allreduce", help="all-reduce algorithms vs dist.all_reduce", doc=__doc__)
    p.add_argument("--world-size", type=int, default=4, help="local ranks (default 4)")
    add_sizes_flag(p, "4K,64K,1M,16M,64M")
    p.add_argument("--algorithms", default="all",
                   help=f"all or a comma list of {', '.join(algorithm_names())}")
    p.add_argument("--codec", default="fp32", help="comma list of codec specs (default fp32)")
    p.add_argument("--link", default=None, help="emulated link, e.g. bw=1gbit,lat=100us")
    p.add_argument("--repeats", type=int, default=100, help="most rounds per size (default 100)")
    p.add_argument("--min-repeats", type=int, default=5,
                   help="fewest rounds per size, however long they take (default 5)")
    p.add_argument("--budget", type=float, default=6.0,
                   help="seconds per size that set the rounds between --min-repeats and "
                        "--repeats")
    add_json_flag(p)
    p.add_argument("--calibrate", action="store_true",
                   help="fit auto's thresholds and write them to --calibration")
    p.add_argument("--calibration", type=Path, default=None,
                   help=f"what the auto algorithm reads: a calibration file (--calibrate writes one; "
                        f"default {DEFAULT_PATH} there), off (the alpha-beta model) or auto "
                        f"(default: this machine's cached calibration, measured on first use)")
    p.set_defaults(func=run)


def add_sizes_flag(p: argparse.ArgumentParser, default: str,
                   what: str = "message sizes in bytes") -> None:
    """`--sizes`, the comma list `parse_sizes` reads (`bench allreduce`, `collective`, `p2p`)."""
    p.add_argument("--sizes", default=default,
                   help=f"{what}, K/M/G = 2^10/2^20/2^30 (default %(default)s)")


def parse_sizes(text: str) -> tuple[int, ...]:
    """`4K,64K,1M` -> bytes; each must be a positive multiple of 4 (fp32 values)."""
    sizes = []
    for part in text.split(","):
        m = _SIZE.fullmatch(part.strip())
        if not m:
            raise ConfigError(f"size {part!r} is not <number>[K|M|G]; e.g. --sizes 4K,1M,16M")
        n = int(m.group(1)) * _SCALE[m.group(2).upper()]
        if n <= 0 or n % 4:
            raise ConfigError(f"size {part!r} = {n} bytes must be a positive multiple of 4 "
                              f"(fp32 values)")
        sizes.append(n)
    return tuple(sizes)


def parse_algorithms(text: str) -> list[str]:
    """`all` or a comma list; every name is checked against the registry."""
    if text.strip() == "all":
        return algorithm_names()
    chosen = list(name_list(text))
    for name in chosen:
        get_algorithm(name)
    return chosen


def combos_for(algorithms: list[str], codecs: list[str]) -> tuple[Combo, ...]:
    """`native` fp32 first (the baseline), then each other algorithm with each codec."""
    out = [BASELINE] + [(a, c) for c in codecs for a in algorithms if a != "native"]
    return tuple(dict.fromkeys(out))


def _measure(args: argparse.Namespace, plan: BenchPlan) -> list[Row]:
    if under_torchrun():  # e.g. `approxdist cluster run -- bench allreduce` across hosts
        torch.set_num_threads(1)  # as run_on_ranks' local ranks: the same measurement
        ctx = init_from_env(timeout_s=300.0)
        try:
            mine = measure_rank(ctx, plan)
            per_rank: list[Any] = [None] * ctx.world_size
            dist.all_gather_object(per_rank, mine)
        finally:
            shutdown(ctx)
        return summarize(per_rank, ctx.world_size, plan.link)
    per_rank = run_on_ranks(measure_rank, args.world_size, plan, timeout_s=3600,
                            comm_timeout_s=300)
    return summarize(per_rank, args.world_size, plan.link)


def check_rounds(min_repeats: int, repeats: int) -> None:
    """`ConfigError` naming the flag unless 1 <= --min-repeats <= --repeats."""
    if repeats < 1:
        raise ConfigError(f"--repeats {repeats} must be >= 1; e.g. --repeats 100")
    if not 1 <= min_repeats <= repeats:
        raise ConfigError(f"--min-repeats {min_repeats} must be from 1 to --repeats "
                          f"({repeats}); e.g. --min-repeats {min(5, repeats)}")


def world_size(args: argparse.Namespace) -> int:
    """The ranks measured: torchrun's world under torchrun, else --world-size."""
    return int(os.environ["WORLD_SIZE"]) if under_torchrun() else int(args.world_size)


def under_torchrun() -> bool:
    """Inside a torchrun worker: the world comes from the environment, not --world-size."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run(args: argparse.Namespace) -> int:
    sizes, algorithms = parse_sizes(args.sizes), parse_algorithms(args.algorithms)
    codecs = [get_codec(c).spec for c in args.codec.split(",")]
    link = parse_link(args.link)
    if args.world_size < 1:
        raise ConfigError(f"--world-size {args.world_size} must be >= 1")
    check_rounds(args.min_repeats, args.repeats)
    cal_path: Path | None = args.calibration or (DEFAULT_PATH if args.calibrate else None)

    def plan(names: list[str], calibration: Path | None) -> BenchPlan:
        return BenchPlan(sizes, combos_for(names, codecs), link.spec if link else None,
                         str(calibration) if calibration else None, args.repeats,
                         args.min_repeats, args.budget)

    with HostWatch() as host:
        if not args.calibrate:
            rows = _measure(args, plan(algorithms, cal_path))
        else:
            assert cal_path is not None
            rows = _measure(args, plan([a for a in algorithms if a != "auto"], None))
            cal = fit(measurements(rows, codecs[0]), world_size(args),
                      link.spec if link else "none", codecs[0])
            print(f"calibration written to {cal.save(cal_path)}: " + ", ".join(
                f"<= {m} B: {a}" if m is not None else f"above: {a}" for m, a in cal.thresholds))
            if "auto" in algorithms:  # measure again, auto included, in one run
                rows = _measure(args, plan(algorithms, cal_path))
    if under_torchrun() and os.environ["RANK"] != "0":
        return 0  # rank 0 prints and writes the rows
    print(table(rows))
    finish(host, [r.as_json() for r in rows], args.json,
           f"approxdist bench allreduce --world-size {world_size(args)} --sizes {args.sizes} "
           f"--algorithms {args.algorithms} --codec {args.codec}"
           + (f" --link {args.link}" if args.link else "")
           + (f" --repeats {args.repeats}" if args.repeats != 100 else "")
           + (f" --min-repeats {args.min_repeats}" if args.min_repeats != 5 else "")
           + (f" --budget {args.budget:g}" if args.budget != 6.0 else "")
           + (" --calibrate" if args.calibrate else "")
           + (f" --calibration {args.calibration}" if args.calibration else ""))
    return 0
