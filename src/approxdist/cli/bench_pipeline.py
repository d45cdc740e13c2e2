"""`approxdist bench pipeline`: our pipeline engine vs `torch.distributed.pipelining` (seed 002).

    approxdist bench pipeline --model mlp --stages 2 --microbatches 4,8 \
        --schedule gpipe,1f1b --json pipeline.json

Both engines run the same model, cut at the same blocks, with the same schedule
(GPipe = ScheduleGPipe, 1F1B = Schedule1F1B, ZB-H1 = ScheduleInterleavedZeroBubble on one
chunk per rank, ZB-V = ScheduleZBVZeroBubble on the two chunks of each rank's V; ZB-H2
is ours only), micro-batches and data, on P local gloo
ranks started by `run_on_ranks`, one torch thread each; every schedule's engines take
turns in each round (method: `approxdist.benchmarks.pipeline`); torch's warm-up losses
must equal ours, or the run stops before its table. The table gives the
median samples/s, the ratio to torch, the ratio to our 1F1B-flush (`--schedule
1f1b,2bw,pipedream`: the asynchronous schedules, which torch does not have, each round
one stream of `--steps` mini-batches) and our measured bubble next to theory. `--link`
shapes our transfers only: torch's p2p bypasses the link layer, so its row stays an
unshaped baseline.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from approxdist.bench.baseline import BaselineMismatch
from approxdist.bench.host import HostWatch
from approxdist.bench.report import Column, add_round_flags, check_counts, finish, render
from approxdist.bench.stats import median, paired_ratio
from approxdist.bench.timing import Timing
from approxdist.benchmarks.pipeline import BenchCase, last_losses, loss_mismatch, measure_rank
from approxdist.cli.groups import command
from approxdist.config.pipeline import FUSE_CHOICES
from approxdist.errors import ConfigError
from approxdist.launch.spawn import run_on_ranks
from approxdist.models.bench_inputs import bench_input
from approxdist.models.gpt import SIZES as GPT_SIZES
from approxdist.pipeline.schedule import async_schedule_names
from approxdist.pipeline.schedule.action import is_split
from approxdist.pipeline.schedule.grid import split_bubble, theoretical_bubble
from approxdist.pipeline.schedule.registry import build_schedule, num_chunks
from approxdist.text import positive_ints
from approxdist.train.parts import check_pipeline

#: figures of our engine beyond the common ones: (case, every rank's measurement) -> keys
Extra = Callable[[BenchCase, list[dict[str, Any]]], dict[str, Any]]

#: per-sample input shape of each benchmark model (an MLP on 1024 features, CIFAR images)
INPUTS = {"mlp": (1024,), "resnet20": (3, 32, 32), "resnet56": (3, 32, 32)}


def register(sub: Any) -> None:
    p = command(sub, "pipeline", help="pipeline engine vs torch.distributed.pipelining", doc=__doc__)
    add_case_arguments(p, "4,8")
    p.set_defaults(func=run)


def add_case_arguments(p: argparse.ArgumentParser, microbatches: str) -> None:
    """The flags of one pipeline case (shared with `bench hybrid`, per pipeline row there)."""
    p.add_argument("--model", default="mlp", choices=sorted(INPUTS) + sorted(GPT_SIZES),
                   help="mlp (8 blocks of 1024, the default), a CIFAR ResNet, or a GPT "
                        "(byte tokens, 64 positions, next-token loss)")
    p.add_argument("--stages", type=int, default=2, help="pipeline stages (default 2)")
    p.add_argument("--microbatches", default=microbatches,
                   help="comma list, per pipeline row (default %(default)s)")
    p.add_argument("--schedule", default="gpipe,1f1b",
                   help="comma list of gpipe, 1f1b, the zero-bubble zbh1, zbh2, zbv (split "
                        "backward; zbv: two chunks per rank in a V) and the asynchronous "
                        "2bw, pipedream, pipedream-vsync (ours only; one stream of --steps "
                        "mini-batches per round)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="mini-batch per pipeline row (default 64)")
    p.add_argument("--split", default="", help="explicit cut, e.g. 4 (default: by parameters)")
    p.add_argument("--balance", default="", choices=["", "params", "time"],
                   help="partition by parameters (default) or by profiled block times")
    p.add_argument("--link", default="", help="emulated link for our engine, e.g. bw=1gbit")
    p.add_argument("--fwd-codec", default="fp32", help="our activations' wire format")
    p.add_argument("--bwd-codec", default="fp32", help="our gradients' wire format")
    p.add_argument("--fuse-accumulation", default="auto", choices=FUSE_CHOICES,
                   help="our stages' fused Linear weight-gradient accumulation (default auto)")
    add_round_flags(p, rounds=5, steps=10)


def plan_cases(args: argparse.Namespace, replicas: int = 1) -> list[BenchCase]:
    """One case per (schedule, micro-batch count); each is validated before any rank starts."""
    check_counts(rounds=args.rounds, steps=args.steps, batch_size=args.batch_size,
                 replicas=replicas)
    inputs = bench_input(args.model, INPUTS.get(args.model, ()))
    cases = [BenchCase(args.model, inputs.shape, args.stages, m, s.strip(),
                       batch_size=args.batch_size, split=args.split,
                       balance="" if args.split else args.balance, link=args.link,
                       fwd_codec=args.fwd_codec, bwd_codec=args.bwd_codec,
                       fuse_accumulation=args.fuse_accumulation, replicas=replicas,
                       classes=inputs.classes, tokens=inputs.tokens)
             for s in args.schedule.split(",") for m in positive_ints(args.microbatches, "--microbatches")]
    for case in cases:
        if case.microbatches > case.batch_size:
            raise ConfigError(f"--microbatches {case.microbatches} exceeds --batch-size "
                              f"{case.batch_size}; use 1..{case.batch_size}")
        check_pipeline(case.pipeline_config())  # ConfigError naming a bad schedule or codec
    if args.stages < 2:
        raise ConfigError(f"--stages {args.stages}: a pipeline benchmark needs 2 or more stages")
    return cases


def summarize(cases: list[BenchCase], per_rank: list[list[dict[str, Any]]],
              steps: int, extra: Extra | None = None) -> list[dict[str, Any]]:
    """Rows: median samples/s per engine (rank 0's clock), ratios, bubbles.

    `ratio_vs_torch` is the ratio of the medians; `paired_ratio` the median over rounds of
    torch's round time over ours in the same round (the two run back to back), which load
    that drifts during the run does not bias; torch has no asynchronous schedules, so their
    rows have neither. `vs_1f1b` is the same paired ratio against our 1F1B-flush when the
    run measured it with the same micro-batches (the schedules of a run are interleaved).
    `weight_copy_bytes_per_step`: weights our asynchronous streams copied, all ranks, per
    step (0 when the optimiser steps out of place). `warmup_losses`: the engine's losses of
    its warm-up steps (`BaselineMismatch` if torch's
    differ from ours: the two would not train the same model).
    """
    rows = []
    for i, case in enumerate(cases):
        mismatch = loss_mismatch(case, [r[i] for r in per_rank])
        if mismatch is not None:
            raise BaselineMismatch(mismatch)
        rounds = per_rank[0][i]["rounds"]
        flush = _ours_1f1b(cases, per_rank, case)
        samples = steps * case.batch_size * case.replicas
        rate = {name: samples / median(ts) for name, ts in rounds.items()}
        torch_rounds = rounds.get("torch")
        bubble = statistics.mean(r[i]["bubble"] for r in per_rank)
        for engine, sps in rate.items():
            ts = rounds[engine]
            rows.append({"engine": engine, "model": case.model, "schedule": case.schedule,
                         "stages": case.stages, "replicas": case.replicas,
                         "microbatches": case.microbatches,
                         "batch_size": case.batch_size, "link": case.link or "none",
                         "bind_cores": case.bind_cores, "samples_per_s": sps,
                         "ratio_vs_torch": sps / rate["torch"] if "torch" in rate else None,
                         "paired_ratio": (paired_ratio(torch_rounds, ts)
                                          if torch_rounds is not None else None),
                         "vs_1f1b": (paired_ratio(flush, ts)
                                     if flush is not None and engine == "approxdist" else None),
                         "bubble_measured": bubble if engine == "approxdist" else None,
                         "bubble_theory": _bubble_theory(case, steps),
                         "weight_copy_bytes_per_step": (
                             _copies([r[i] for r in per_rank], len(ts) * steps)
                             if engine == "approxdist" else None),
                         "warmup_losses": last_losses([r[i] for r in per_rank], engine),
                         **(extra(case, [r[i] for r in per_rank])
                            if extra is not None and engine == "approxdist" else {})})
    return rows


def _copies(results: list[dict[str, Any]], steps: int) -> float | None:
    """Bytes of weights our engine's streams copied per step, over the ranks' `results`
    (None: not counted, e.g. by `bench hybrid`)."""
    counts = [r.get("weight_copy_bytes") for r in results]
    return None if None in counts else sum(int(c or 0) for c in counts) / steps


def _ours_1f1b(cases: list[BenchCase], per_rank: list[list[dict[str, Any]]],
               case: BenchCase) -> list[float] | None:
    """Our 1F1B-flush round times measured beside `case` (same micro-batches), if any."""
    for j, other in enumerate(cases):
        if other.schedule == "1f1b" and replace(other, schedule=case.schedule) == case:
            return list(per_rank[0][j]["rounds"]["approxdist"])
    return None


def _bubble_theory(case: BenchCase, steps: int) -> float:
    """(P-1)/(M+P-1) for a flushed schedule; over a stream of `steps` mini-batches
    (P-1)/(steps*M+P-1) for an asynchronous one; (P-1)/(3cM+P-1) for a split backward on
    c chunks per rank (zbv: 2)."""
    streamed = case.schedule in async_schedule_names()
    if not streamed and is_split(build_schedule(case.schedule, case.stages,
                                                case.microbatches)[0]):
        chunks = num_chunks(case.schedule, case.stages) // case.stages
        return split_bubble(case.stages, case.microbatches, chunks)
    return theoretical_bubble(case.stages, case.microbatches * (steps if streamed else 1))


COLUMNS = (Column("model", 9, "model", left=True), Column("schedule", 8, "schedule", left=True),
           Column("P", 2, "stages"), Column("M", 3, "microbatches"),
           Column("engine", 11, "engine", left=True), Column("samples/s", 10, "samples_per_s", ".1f"),
           Column("vs torch", 8, show=lambda r: f"{r['ratio_vs_torch']:.3f}x"
                  if r.get("ratio_vs_torch") is not None else "-"),
           Column("paired", 7, show=lambda r: f"{r['paired_ratio']:.3f}x"
                  if r.get("paired_ratio") is not None else "-"),
           Column("vs 1f1b", 7, show=lambda r: f"{r['vs_1f1b']:.3f}x"
                  if r.get("vs_1f1b") is not None else "-"),
           Column("bubble", 7, "bubble_measured", ".3f"), Column("theory", 7, "bubble_theory", ".3f"))


def table(rows: list[dict[str, Any]]) -> str:
    return render(COLUMNS, rows)


def run(args: argparse.Namespace) -> int:
    return run_bench(args, plan_cases(args), measure_rank, "pipeline", table)


def run_bench(args: argparse.Namespace, cases: list[BenchCase], measure: Callable[..., Any],
              kind: str, show: Callable[[list[dict[str, Any]]], str],
              extra: Extra | None = None) -> int:
    """Measure `cases` on their ranks, print the table, finish (host, reproduce, --json)."""
    timing = Timing(rounds=args.rounds, steps=args.steps)
    ranks = cases[0].stages * cases[0].replicas
    with HostWatch() as host:
        per_rank = run_on_ranks(measure, ranks, cases, timing, timeout_s=3600, comm_timeout_s=300)
    rows = summarize(cases, per_rank, args.steps, extra)
    print(show(rows))
    print(f"(medians of {args.rounds} rounds of {args.steps} mini-batches; paired = median over "
          "rounds of torch's time / ours in the same round; bubble = share of each rank's step "
          "time not computing, averaged over ranks)")
    finish(host, rows, args.json, f"approxdist bench {kind} " + " ".join(_argv(args)))
    return 0


def _argv(args: argparse.Namespace) -> list[str]:
    out = [f"--model {args.model}", f"--stages {args.stages}",
           f"--microbatches {args.microbatches}", f"--schedule {args.schedule}",
           f"--batch-size {args.batch_size}", f"--rounds {args.rounds}", f"--steps {args.steps}"]
    if getattr(args, "replicas", 1) != 1:
        out.append(f"--replicas {args.replicas}")
    for key in ("split", "balance", "link"):
        if getattr(args, key):
            out.append(f"--{key} {getattr(args, key)}")
    for key in ("fwd_codec", "bwd_codec", "fuse_accumulation"):
        if getattr(args, key) not in ("fp32", "auto"):
            out.append(f"--{key.replace('_', '-')} {getattr(args, key)}")
    for key in ("bucket_mb", "first_bucket_mb"):  # bench hybrid's
        if getattr(args, key, None) is not None:
            out.append(f"--{key.replace('_', '-')} {getattr(args, key)}")
    if getattr(args, "bind_cores", "none") != "none":
        out.append(f"--bind-cores {args.bind_cores}")
    return out
