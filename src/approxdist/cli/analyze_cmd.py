"""`approxdist analyze RUN_DIR`: the bottleneck report of a traced run (seed 002).

Reads `trace.json` (or merges `trace.rank<N>.json`), `metrics.jsonl` and `config.toml`
from the run directory; prints per-rank compute / communication / waiting / bubble
fractions, per-link bytes, time and effective bandwidth, the slowest stage and what it
waits for, the pipeline bubble against theory, each rank's time per step by phase
(`analysis.phase_times`); writes a PNG timeline chart. The
definitions are in `approxdist.analysis.bottleneck` and docs/tracing.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from approxdist.analysis import RunInfo, analyze, format_report, report_dict
from approxdist.analysis.phase_times import format_phase_times, phase_times
from approxdist.trace.errors import TraceError
from approxdist.trace.gather import load_run_trace


def register(sub: Any) -> None:
    p = sub.add_parser(
        "analyze", help="bottleneck report and timeline chart of a traced run",
        description="Read RUN_DIR/trace.json (+ metrics.jsonl, config.toml) and print where "
                    "each rank spends its step: compute, communication, waiting, bubble; "
                    "per-link bytes and bandwidth; the slowest stage; bubble vs theory.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory holding trace.json")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    p.add_argument("--png", metavar="PATH", help="timeline chart path (default RUN_DIR/timeline.png)")
    p.add_argument("--no-png", action="store_true", help="do not draw the timeline chart")
    p.add_argument("--chart-steps", type=int, default=4, metavar="N",
                   help="chart the last N traced steps (0: the whole trace; default 4)")
    p.add_argument("--skip-steps", type=int, default=0, metavar="N",
                   help="leave each rank's first N traced steps (warm-up) out of the figures")
    p.add_argument("--stages", type=int, metavar="P", help="pipeline stages (default: config.toml)")
    p.add_argument("--microbatches", type=int, metavar="M",
                   help="micro-batches per mini-batch (default: config.toml)")
    p.set_defaults(func=run_analyze)


def run_analyze(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise TraceError(f"run directory {str(run_dir)!r} does not exist; pass the --out "
                         f"directory of a run made with tracing on")
    trace = load_run_trace(run_dir)
    info = RunInfo.load(run_dir, trace)
    stages = args.stages if args.stages is not None else info.stages
    microbatches = args.microbatches if args.microbatches is not None else info.microbatches
    result = analyze(trace, stages, microbatches, skip=args.skip_steps)
    phases = phase_times(trace, skip=args.skip_steps)
    print(format_report(result, info, f"approxdist analyze {run_dir}"))
    print("\n" + format_phase_times(phases))
    if args.json:
        figures = {**report_dict(result, info), "phase_s_per_step": phases}
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
        print(f"\nfigures written to {args.json}")
    if not args.no_png:
        from approxdist.analysis.chart import draw_timeline

        png = Path(args.png) if args.png else run_dir / "timeline.png"
        draw_timeline(trace, png, title=f"{run_dir.name}: timeline by phase",
                      last_steps=args.chart_steps)
        print(f"timeline chart written to {png}")
    return 0
