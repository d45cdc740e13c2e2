"""`approxdist bench trace`: what one `with rec.span(...)` costs, disabled and enabled (docs/tracing.md).

    approxdist bench trace --calls 100000 --json trace-cost.json

Prints nanoseconds per span for the disabled recorder, an enabled one with and without
`torch.profiler.record_function` ranges, and inside an active `torch.profiler` session,
each as a ratio to the baseline measured in the same run: the same loop with a bare
`with` on a shared no-op context (the least a `with` line can cost). Each figure is the
best of 5 loops of `--calls` spans (the loop's own overhead included; method:
`approxdist.benchmarks.trace`).
"""

from __future__ import annotations

import argparse
from typing import Any

from approxdist.bench.host import HostWatch
from approxdist.bench.report import add_json_flag, finish, render
from approxdist.benchmarks.trace import COLUMNS, measure
from approxdist.cli.groups import command
from approxdist.errors import ConfigError


def register(sub: Any) -> None:
    p = command(sub, "trace", help="cost of a timeline span, disabled and enabled", doc=__doc__)
    p.add_argument("--calls", type=int, default=100_000, help="spans per loop (default 100000)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.calls < 1:
        raise ConfigError(f"--calls {args.calls} must be >= 1; e.g. --calls 100000")
    with HostWatch() as host:
        rows = measure(args.calls)
    print(render(COLUMNS, rows))
    finish(host, rows, args.json, f"approxdist bench trace --calls {args.calls}")
    return 0
