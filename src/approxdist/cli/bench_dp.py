"""`approxdist bench dp`: our data-parallel engine vs torch DDP, same model and batch, one run.

    approxdist bench dp --world-size 2 --model resnet20 --codec fp32,bf16 --json dp.json
    approxdist bench dp --model resnet56 --link bw=1gbit
    approxdist bench dp --model mlp --codec bf16,bits:s0e2+2m0 --error-feedback \
        --ddp-codec fp16 --link bw=1gbit
    approxdist bench dp --model resnet20 --codec powersgd:2,topk:0.01 \
        --ddp-codec fp32,fp16,powersgd:2 --link bw=100mbit

Prints the median step of `local` (no communication: the lower bound), `ddp` and our
engine per codec, the ratio to DDP and the share of communication hidden behind
compute: `hidden` from the time the training thread waited for communication, `wall est`
from the step times (method and caveats: `approxdist.benchmarks.dp`). `--json`
writes the rows with keys engine, codec, link, median_step_s, ratio_vs_ddp,
hidden_comm_fraction (+ paired_ratio_vs_ddp: the median over steps of ours / DDP's at the
same place in the same round, hidden_comm_fraction_wall, comm_only_s, blocked_s,
interference_s, cpu_over_local_s: the process's CPU seconds a step beyond the `local` step's,
bytes_per_step_rank0, model, world_size).
"""

from __future__ import annotations

import argparse
from typing import Any

from approxdist.bench.host import HostWatch
from approxdist.bench.report import Column, add_round_flags, check_counts, finish, ratio, render, scaled
from approxdist.benchmarks.ddp_baselines import ddp_label
from approxdist.benchmarks.dp import DPBenchPlan, codec_label, measure_rank, summarize
from approxdist.cli.groups import command
from approxdist.comm.netem import parse_link
from approxdist.data_parallel.compressed import check_carried
from approxdist.errors import ConfigError
from approxdist.launch.spawn import run_on_ranks
from approxdist.models import MODELS
from approxdist.text import name_list


def register(sub: Any) -> None:
    p = command(sub, "dp", help="data-parallel engine vs torch DDP (step time)", doc=__doc__)
    p.add_argument("--world-size", type=int, default=2, help="local ranks (default 2)")
    p.add_argument("--model", default="resnet20", help=f"{', '.join(MODELS.names())}")
    p.add_argument("--hidden", type=int, default=1536,
                   help="MLP width (default 1536: 3 hidden layers, 9.5M parameters)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank (default 32)")
    p.add_argument("--codec", default="fp32",
                   help="comma list of our engine's codecs; append +ef for error feedback on one")
    p.add_argument("--error-feedback", action="store_true", help="error feedback for lossy codecs")
    p.add_argument("--ddp-codec", default="fp32",
                   help="comma list of DDP's wires, the first the reference row: fp32, fp16 "
                        "(torch's fp16 hook), powersgd:<r> (torch's powerSGD_hook); e.g. "
                        "fp32,fp16,powersgd:2")
    p.add_argument("--link", default=None, help="emulated link, e.g. bw=1gbit,lat=100us")
    p.add_argument("--algorithm", default="auto", help="our engine's all-reduce")
    p.add_argument("--bucket-mb", type=float, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--chunk-kb", type=float, default=None)
    p.add_argument("--early-forward", action="store_true")
    p.add_argument("--gil-switch-ms", type=float, default=None,
                   help="GIL switch interval while comm threads run, for both engines "
                        "(default 0.5; 0 leaves Python's 5 ms)")
    p.add_argument("--calibration", default=None,
                   help="auto's thresholds from approxdist bench allreduce --calibrate")
    add_round_flags(p, rounds=5, steps=4)
    p.set_defaults(func=run)


def plan_from(args: argparse.Namespace) -> DPBenchPlan:
    if args.world_size < 2:
        raise ConfigError(f"--world-size {args.world_size}: data parallelism needs >= 2 ranks")
    check_counts(rounds=args.rounds, steps=args.steps, batch_size=args.batch_size)
    MODELS.get(args.model)
    codecs = tuple(map(codec_label, name_list(args.codec)))
    link = parse_link(args.link)
    options: dict[str, Any] = {"algorithm": args.algorithm, "early_forward": args.early_forward}
    for key in ("bucket_mb", "threads", "chunk_kb", "calibration"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    if args.gil_switch_ms is not None:
        if args.gil_switch_ms < 0:
            raise ConfigError(f"--gil-switch-ms {args.gil_switch_ms} must be >= 0 (0 leaves "
                              f"Python's 5 ms); e.g. 0.5")
        options["gil_switch_ms"] = args.gil_switch_ms or None
    ddp = [ddp_label(c) for c in name_list(args.ddp_codec)] or ["fp32"]
    for codec in codecs:  # an all-gather compressor needs an algorithm with an all-gather
        check_carried(codec, args.algorithm)
    return DPBenchPlan(args.model, args.hidden, 3, args.batch_size, codecs, args.error_feedback,
                       link.spec if link else None, ddp[0], tuple(ddp[1:]),
                       engine_options=options, rounds=args.rounds, steps=args.steps)


def _pct(key: str) -> Any:
    return lambda r: f"{100 * r[key]:.0f}%" if r.get(key) is not None else "-"


COLUMNS = (Column("engine", 11, "engine", left=True), Column("codec", 20, "codec", left=True),
           Column("link", 10, "link", left=True),
           Column("step ms", 8, show=scaled("median_step_s", 1e3, ".1f")),
           Column("vs ddp", 7, show=ratio("ratio_vs_ddp")),
           Column("paired", 7, show=ratio("paired_ratio_vs_ddp")),
           Column("comm ms", 8, show=scaled("comm_only_s", 1e3, ".1f")),
           Column("hidden", 7, show=_pct("hidden_comm_fraction")),
           Column("wall est", 8, show=_pct("hidden_comm_fraction_wall")),
           Column("+cpu ms", 8, show=scaled("cpu_over_local_s", 1e3, ".1f")),
           Column("bytes/step", 11, show=lambda r: f"{r['bytes_per_step_rank0'] / 1e6:.2f}MB"
                  if r.get("bytes_per_step_rank0") else "-"))


def table(rows: list[dict[str, Any]]) -> str:
    return render(COLUMNS, rows)


def run(args: argparse.Namespace) -> int:
    plan = plan_from(args)
    with HostWatch() as host:
        per_rank = run_on_ranks(measure_rank, args.world_size, plan, timeout_s=3600,
                                comm_timeout_s=300)
    rows = summarize(per_rank, plan)
    for r in rows:
        r["model"], r["world_size"] = plan.model, args.world_size
    print(table(rows))
    finish(host, rows, args.json, "approxdist bench dp " + " ".join(_argv(args)))
    return 0


def _argv(args: argparse.Namespace) -> list[str]:
    out = [f"--world-size {args.world_size}", f"--model {args.model}", f"--codec {args.codec}",
           f"--batch-size {args.batch_size}", f"--ddp-codec {args.ddp_codec}"]
    if args.model == "mlp":
        out.append(f"--hidden {args.hidden}")
    if args.link:
        out.append(f"--link {args.link}")
    if args.error_feedback:
        out.append("--error-feedback")
    if args.early_forward:
        out.append("--early-forward")
    for key in ("bucket_mb", "threads", "chunk_kb", "calibration", "gil_switch_ms"):
        if getattr(args, key) is not None:
            out.append(f"--{key.replace('_', '-')} {getattr(args, key)}")
    return out
