"""`approxdist bench stage`: one stage's compute alone, whole vs split backward, fused vs not.

    approxdist bench stage --width 1024 --layers 4 --rows 8 --microbatches 4 --rounds 15

Method and variants: `approxdist.benchmarks.stage` (one process, no transfer, interleaved
rounds, medians, the paired ratio to `1f1b fused`).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

import torch

from approxdist.bench.host import HostWatch
from approxdist.bench.report import Column, add_json_flag, check_counts, finish, ratio, render, scaled
from approxdist.benchmarks.stage import StageCase, measure
from approxdist.cli.groups import command
from approxdist.errors import ConfigError

COLUMNS = (Column("schedule", 8, "schedule", left=True), Column("fusion", 6, "fusion", left=True),
           Column("ms/step", 8, show=scaled("step_s", 1e3, ".2f")),
           Column("vs 1f1b fused", 13, show=ratio("vs_base")))


def register(sub: Any) -> None:
    p = command(sub, "stage", help="one stage's compute: whole vs split backward, fused or not", doc=__doc__)
    for flag, default, what in (("width", 1024, "features of every linear layer"),
                                ("layers", 4, "linear + ReLU blocks in the stage"),
                                ("rows", 8, "rows per micro-batch"),
                                ("microbatches", 4, "micro-batches per step"),
                                ("stages", 2, "pipeline stages (the order's shape)"),
                                ("stage", 1, "whose schedule order the stage runs"),
                                ("rounds", 15, "interleaved rounds"),
                                ("steps", 4, "steps per variant and round")):
        p.add_argument(f"--{flag}", type=int, default=default,
                       help=f"{what} (default %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_counts(width=args.width, layers=args.layers, rows=args.rows,
                 microbatches=args.microbatches, stages=args.stages, rounds=args.rounds,
                 steps=args.steps, threads=args.threads)
    if not 0 <= args.stage < args.stages:
        raise ConfigError(f"--stage {args.stage} is not a stage of --stages {args.stages}; "
                          f"use 0..{args.stages - 1}")
    torch.set_num_threads(args.threads)
    case = StageCase(args.width, args.layers, args.rows, args.microbatches, args.stages,
                     args.stage)
    with HostWatch() as host:
        rows = measure(case, args.rounds, args.steps)
    print(f"stage {case.stage} of {case.stages}: {case.layers} x Linear({case.width}) + ReLU, "
          f"{case.microbatches} micro-batches of {case.rows} rows, {args.threads} thread(s), "
          f"median of {args.rounds} rounds x {args.steps} steps")
    print(render(COLUMNS, [asdict(r) for r in rows]))
    finish(host, [asdict(r) for r in rows], args.json,
           f"approxdist bench stage --width {args.width} --layers {args.layers} --rows "
           f"{args.rows} --microbatches {args.microbatches} --stages {args.stages} --stage "
           f"{args.stage} --rounds {args.rounds} --steps {args.steps} --threads {args.threads}")
    return 0
