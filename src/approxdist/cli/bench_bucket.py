"""`approxdist bench bucket`: a bucket's bit-packed compressors per tensor vs one kernel call a phase.

    approxdist bench bucket --model resnet56 --codecs sign+ef,qsgd:7 --threads 1

One worker's exchange (encode, then the combine of `--workers` copies of its payload) of
a bucket of the model's weight matrices, timed per tensor (each member its own encode and
combine), as the bucket path (one kernel call a phase) and as one flat tensor of the same
values (the floor), interleaved; medians and paired ratios (`approxdist.benchmarks.bucket`).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

import torch

from approxdist.bench.host import HostWatch
from approxdist.bench.report import add_json_flag, check_counts, finish
from approxdist.benchmarks.bucket import matrices, measure, table
from approxdist.cli.groups import command
from approxdist.config.schema import ModelConfig
from approxdist.errors import ConfigError
from approxdist.models import MODELS, build_model
from approxdist.models.bench_inputs import bench_input
from approxdist.text import name_list

PACKED = "sign+ef,signsgd,qsgd:7,terngrad"


def register(sub: Any) -> None:
    p = command(sub, "bucket", help="a bucket's compressors per tensor vs one call a phase",
                doc=__doc__)
    p.add_argument("--model", default="resnet56", help=f"{', '.join(MODELS.names())}")
    p.add_argument("--codecs", default=PACKED,
                   help="bit-packed compressors, a comma list (default %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="payloads combined (default 2)")
    p.add_argument("--repeats", type=int, default=21, help="timed rounds (default 21)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads (default 1: a communication thread)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_counts(workers=args.workers, repeats=args.repeats, threads=args.threads)
    MODELS.get(args.model)
    torch.set_num_threads(args.threads)
    inputs = bench_input(args.model, (3, 32, 32), 10)
    shapes = matrices(build_model(ModelConfig(name=args.model), inputs.shape, inputs.classes))
    if not shapes:
        raise ConfigError(f"--model {args.model} has no weight matrices; e.g. --model resnet56")
    with HostWatch() as host:
        rows = [measure(spec, shapes, args.workers, args.repeats)
                for spec in name_list(args.codecs)]
    print(f"bucket of {args.model}'s {len(shapes)} weight matrices, one worker's encode + "
          f"combine of {args.workers} payloads, {torch.get_num_threads()} thread(s), median "
          f"of {args.repeats}; baseline: per tensor")
    print(table(rows))
    finish(host, [asdict(r) for r in rows], args.json,
           f"approxdist bench bucket --model {args.model} --codecs {args.codecs} --workers "
           f"{args.workers} --repeats {args.repeats} --threads {args.threads}")
    return 0
