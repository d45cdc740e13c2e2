"""`approxdist bench hybrid`: our hybrid pipeline x data parallelism vs the torch composition.

    approxdist bench hybrid --model mlp --stages 2 --replicas 2 --microbatches 4 \
        --schedule gpipe,1f1b --json hybrid.json

The baseline is what users build today (torchtitan's way): `torch.distributed.pipelining`
stages on each pipeline row and the stage modules replicated with `replicate` (DDP on
the FSDP2 machinery) over each stage's replicas. Same model, cut, schedule, micro-batches
per row and data, on stages x replicas local gloo ranks, interleaved rounds (method:
`approxdist.hybrid.bench`). Beyond `bench pipeline`'s columns: `hidden`, the share of our
replica all-reduce that the last backward hid (1 - blocked / all-reduce alone, median
over ranks). `--link` shapes our transfers only.
"""

from __future__ import annotations

import argparse
from typing import Any

from approxdist.bench.report import Column, render
from approxdist.bench.stats import median
from approxdist.cli.bench_pipeline import COLUMNS as PIPELINE_COLUMNS
from approxdist.cli.bench_pipeline import add_case_arguments, plan_cases, run_bench
from approxdist.hybrid.bench import measure_rank
from approxdist.pipeline.runtime_bench import BenchCase

COLUMNS = (*PIPELINE_COLUMNS[:3], Column("r", 2, "replicas"), *PIPELINE_COLUMNS[3:],
           Column("hidden", 7, show=lambda r: f"{100 * r['hidden_comm_fraction']:.0f}%"
                  if r.get("hidden_comm_fraction") is not None else "-"))


def register(sub: Any) -> None:
    p = sub.add_parser("hybrid", help="hybrid PP x DP vs torch pipelining + replicate",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_case_arguments(p, "4")
    p.add_argument("--replicas", type=int, default=2, help="ranks per stage (default 2)")
    p.set_defaults(func=run)


def hidden(case: BenchCase, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Our replica all-reduce: blocked and alone per step (medians over ranks), hidden share."""
    blocked = [r["blocked_s"] for r in ranks if r.get("blocked_s") is not None]
    alone = [r["comm_only_s"] for r in ranks if r.get("comm_only_s") is not None]
    if not blocked or not alone or median(alone) <= 0:
        return {"hidden_comm_fraction": None}
    share = 1.0 - median(blocked) / median(alone)
    return {"blocked_s": median(blocked), "comm_only_s": median(alone),
            "hidden_comm_fraction": min(1.0, max(0.0, share))}


def table(rows: list[dict[str, Any]]) -> str:
    return render(COLUMNS, rows)


def run(args: argparse.Namespace) -> int:
    return run_bench(args, plan_cases(args, args.replicas), measure_rank, "hybrid", table, hidden)
