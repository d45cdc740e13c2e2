"""`approxdist bench KIND`: benchmarks that compare against a named baseline in the same run."""

from __future__ import annotations

from typing import Any

from approxdist.cli import (
    bench_allreduce,
    bench_bucket,
    bench_codec,
    bench_collective,
    bench_dp,
    bench_hybrid,
    bench_p2p,
    bench_pipeline,
    bench_stage,
    bench_tp,
    bench_trace,
)
from approxdist.cli.groups import command_group

#: each module has `register(subparsers)`: one `approxdist bench KIND` each
BENCHES: tuple[Any, ...] = (bench_codec, bench_bucket, bench_allreduce, bench_collective,
                            bench_p2p, bench_dp, bench_pipeline, bench_stage, bench_hybrid,
                            bench_tp, bench_trace)


def register(sub: Any) -> None:
    kinds = command_group(sub, "bench", "run a benchmark against its baseline",
                          "Benchmarks print a table with ratios to a baseline measured in the "
                          "same run; --json writes the rows.", metavar="KIND")
    for module in BENCHES:
        module.register(kinds)
