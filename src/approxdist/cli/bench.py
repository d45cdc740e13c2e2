"""`approxdist bench KIND`: benchmarks that compare against a named baseline in the same run."""

from __future__ import annotations

import argparse
from typing import Any

from approxdist.cli import bench_allreduce, bench_codec, bench_dp, bench_pipeline

#: each module has `register(subparsers)`; later issues add allreduce, dp, pipeline
BENCHES: tuple[Any, ...] = (bench_codec, bench_allreduce, bench_dp, bench_pipeline)


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="run a benchmark against its baseline",
                       description="Benchmarks print a table with ratios to a baseline "
                                   "measured in the same run; --json writes the rows.")
    kinds = p.add_subparsers(dest="bench", metavar="KIND")
    for module in BENCHES:
        module.register(kinds)
    p.set_defaults(func=lambda a: _missing(p, a))


def _missing(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    p.print_help()
    return 2
