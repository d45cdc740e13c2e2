"""`approxdist bench hybrid`: our hybrid pipeline x data parallelism vs the torch composition.

    approxdist bench hybrid --model mlp --stages 2 --replicas 2 --microbatches 4 \
        --schedule gpipe,1f1b --json hybrid.json

The baseline is what users build today (torchtitan's way): `torch.distributed.pipelining`
stages on each pipeline row and the stage modules replicated with `replicate` (DDP on
the FSDP2 machinery) over each stage's replicas. Same model, cut, schedule, micro-batches
per row and data, on stages x replicas local gloo ranks, interleaved rounds (method:
`approxdist.benchmarks.hybrid`). Beyond `bench pipeline`'s columns: `hidden`, the share of our
replica all-reduce that the last backward hid (1 - blocked / all-reduce alone, per stage
on the replica that waited least, summed over stages; `by_stage` in the JSON). `--link`
shapes our transfers only; `--bind-cores` binds both engines' ranks alike.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from approxdist.bench.report import Column, render
from approxdist.bench.stats import median
from approxdist.benchmarks.hybrid import measure_rank
from approxdist.benchmarks.pipeline import BenchCase
from approxdist.cli.bench_pipeline import COLUMNS as PIPELINE_COLUMNS
from approxdist.cli.bench_pipeline import add_case_arguments, plan_cases, run_bench
from approxdist.cli.groups import command
from approxdist.config.dp import DPConfig, check_sizes
from approxdist.config.schema import BIND_POLICIES
from approxdist.errors import ConfigError
from approxdist.launch.affinity import check_policy
from approxdist.pipeline.schedule import async_schedule_names

COLUMNS = (*PIPELINE_COLUMNS[:3], Column("r", 2, "replicas"), *PIPELINE_COLUMNS[3:],
           Column("hidden", 7, show=lambda r: f"{100 * r['hidden_comm_fraction']:.0f}%"
                  if r.get("hidden_comm_fraction") is not None else "-"))


#: the schedules compared with torch pipelining + replicate (whole backwards)
HYBRID_SCHEDULES = ("gpipe", "1f1b")


def register(sub: Any) -> None:
    p = command(sub, "hybrid", help="hybrid PP x DP vs torch pipelining + replicate", doc=__doc__)
    add_case_arguments(p, "4")
    p.add_argument("--replicas", type=int, default=2, help="ranks per stage (default 2)")
    p.add_argument("--bucket-mb", type=float, default=None,
                   help="our replica all-reduce's bucket size in MB (default: [dp] bucket_mb, "
                        "1.0); smaller buckets start more of it during the last backward")
    p.add_argument("--first-bucket-mb", type=float, default=None,
                   help="its first bucket in MB (default: [dp] first_bucket_mb, 0.25)")
    p.add_argument("--bind-cores", choices=BIND_POLICIES, default="none",
                   help="bind each rank's threads to cores, both engines alike: none "
                        "(default), rank, row (a pipeline row's ranks share cores, a stage's "
                        "replicas on different ones)")
    p.set_defaults(func=run)


def hidden(case: BenchCase, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Our replica all-reduce: per stage, the time blocked in `AR` per step on the replica
    that waited least (the others also wait for a replica whose last backward ends later:
    skew, not communication; `bench dp` reads it the same way) against that stage's
    all-reduce alone (median over its replicas); a stage's hidden share is 1 - blocked /
    alone, clamped to [0, 1] (`by_stage`). The row's `hidden_comm_fraction` sums over the
    stages, 1 - sum(blocked) / sum(alone), as `bench dp` sums over a model's buckets: each
    stage's all-reduce weighs by its time, so a stage whose all-reduce takes 1 ms, where a
    scheduler tick decides its share, does not count as much as one of 20 ms.
    `hidden_comm_fraction_stage_mean` is the plain mean of the stages' shares."""
    by_stage = []
    for stage in sorted({r["stage"] for r in ranks}):
        mine = [r for r in ranks if r["stage"] == stage and r.get("blocked_s") is not None]
        if not mine:
            continue
        blocked = min(r["blocked_s"] for r in mine)
        alone = median([r["comm_only_s"] for r in mine])
        by_stage.append({"stage": stage, "blocked_s": blocked, "comm_only_s": alone,
                         "hidden_comm_fraction": _share(blocked, alone)})
    shares = [s["hidden_comm_fraction"] for s in by_stage if s["hidden_comm_fraction"] is not None]
    return {"hidden_comm_fraction": _share(sum(s["blocked_s"] for s in by_stage),
                                           sum(s["comm_only_s"] for s in by_stage)),
            "hidden_comm_fraction_stage_mean": sum(shares) / len(shares) if shares else None,
            "by_stage": by_stage}


def _share(blocked: float, alone: float) -> float | None:
    return min(1.0, max(0.0, 1.0 - blocked / alone)) if alone > 0 else None


def table(rows: list[dict[str, Any]]) -> str:
    return render(COLUMNS, rows)


def run(args: argparse.Namespace) -> int:
    dp = DPConfig()
    check_sizes(dp.bucket_mb if args.bucket_mb is None else args.bucket_mb,
                dp.first_bucket_mb if args.first_bucket_mb is None else args.first_bucket_mb,
                dp.chunk_kb, dp.threads)
    check_policy(args.bind_cores)
    cases = [replace(c, bucket_mb=args.bucket_mb, first_bucket_mb=args.first_bucket_mb,
                     bind_cores=args.bind_cores)
             for c in plan_cases(args, args.replicas)]
    streamed = sorted({c.schedule for c in cases} & set(async_schedule_names()))
    if streamed:  # the baseline (torch pipelining + replicate) has no asynchronous schedule
        raise ConfigError(f"--schedule {','.join(streamed)}: bench hybrid compares flushed "
                          f"schedules ({', '.join(HYBRID_SCHEDULES)}) with torch pipelining + "
                          f"replicate, which has no asynchronous one; train it with "
                          f"approxdist train --parallel hybrid --schedule {streamed[0]}")
    split = sorted({c.schedule for c in cases} - set(HYBRID_SCHEDULES))
    if split:  # zero bubble: torch's on replicated stages is not the same composition
        raise ConfigError(f"--schedule {','.join(split)}: bench hybrid compares "
                          f"{', '.join(HYBRID_SCHEDULES)} with torch pipelining + replicate; "
                          f"train it with approxdist train --parallel hybrid --schedule "
                          f"{split[0]}, or compare it with approxdist bench pipeline")
    return run_bench(args, cases, measure_rank, "hybrid", table, hidden)
