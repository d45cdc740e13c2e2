"""`approxdist bench stage`: one stage's compute alone, whole vs split backward, fused vs not.

    approxdist bench stage --width 1024 --layers 4 --rows 8 --microbatches 4 --rounds 15

Method and variants: `approxdist.benchmarks.stage` (one process, no transfer, interleaved
rounds, medians, the paired ratio to `1f1b fused`).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, fields
from typing import Any

import torch

from approxdist.bench.host import HostWatch
from approxdist.bench.report import Column, add_round_flags, check_counts, finish, ratio, render, scaled
from approxdist.benchmarks.stage import StageCase, measure
from approxdist.cli.groups import command
from approxdist.errors import ConfigError

COLUMNS = (Column("schedule", 8, "schedule", left=True), Column("fusion", 6, "fusion", left=True),
           Column("ms/step", 8, show=scaled("step_s", 1e3, ".2f")),
           Column("vs 1f1b fused", 13, show=ratio("vs_base")))


def register(sub: Any) -> None:
    p = command(sub, "stage", help="one stage's compute: whole vs split backward, fused or not", doc=__doc__)
    case = [(f.name, f.default, f.metadata["help"]) for f in fields(StageCase)]
    for flag, default, what in case + [("threads", 1, "torch threads")]:
        p.add_argument(f"--{flag}", type=int, default=default, help=f"{what} (default %(default)s)")
    add_round_flags(p, rounds=15, steps=4)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    case = StageCase(**{f.name: getattr(args, f.name) for f in fields(StageCase)})
    flags = {**asdict(case), "rounds": args.rounds, "steps": args.steps, "threads": args.threads}
    check_counts(**{k: v for k, v in flags.items() if k != "stage"})
    if not 0 <= case.stage < case.stages:
        raise ConfigError(f"--stage {case.stage} is not a stage of --stages {case.stages}; "
                          f"use 0..{case.stages - 1}")
    torch.set_num_threads(args.threads)
    with HostWatch() as host:
        rows = measure(case, args.rounds, args.steps)
    print(f"stage {case.stage} of {case.stages}: {case.layers} x Linear({case.width}) + ReLU, "
          f"{case.microbatches} micro-batches of {case.rows} rows, {args.threads} thread(s), "
          f"median of {args.rounds} rounds x {args.steps} steps")
    print(render(COLUMNS, [asdict(r) for r in rows]))
    finish(host, [asdict(r) for r in rows], args.json,
           "approxdist bench stage " + " ".join(f"--{k} {v}" for k, v in flags.items()))
    return 0
