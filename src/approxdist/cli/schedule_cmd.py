"""`approxdist schedule show|list`: print a pipeline schedule as a grid, checked, no processes."""

from __future__ import annotations

import argparse
from typing import Any

from approxdist.cli.groups import command_group
from approxdist.pipeline.schedule import build_schedule, format_grid, schedule_names, summary
from approxdist.pipeline.schedule.registry import describe


def register(sub: Any) -> None:
    kinds = command_group(sub, "schedule", "show and check pipeline schedules",
                          "Pipeline schedules are data: print one as a time-step x rank grid "
                          "after validating it.")
    show = kinds.add_parser("show", help="print a schedule as a grid",
                            description="Validate the schedule and print its grid, the "
                                        "bubble fraction and peak in-flight activations.")
    show.add_argument("name", help=f"schedule name: {', '.join(schedule_names())}")
    show.add_argument("--stages", "-p", type=int, required=True, metavar="P",
                      help="pipeline stages (= ranks)")
    show.add_argument("--microbatches", "-m", type=int, required=True, metavar="M",
                      help="micro-batches per mini-batch")
    show.add_argument("--with-comm", action="store_true",
                      help="also show sends (SF, SB) and receive posts (RF, RB)")
    show.set_defaults(func=run_show)
    lister = kinds.add_parser("list", help="list the schedule names")
    lister.set_defaults(func=run_list)


def render_show(name: str, num_stages: int, num_microbatches: int,
                with_comm: bool = False) -> str:
    """The text `schedule show` prints; raises `ScheduleError`/`PipelineError` on bad input."""
    order = build_schedule(name, num_stages, num_microbatches)
    head = (f"schedule {name}: {num_stages} stages (one per rank), "
            f"{num_microbatches} micro-batches; valid")
    return "\n".join([head, format_grid(order, num_stages, with_comm),
                      summary(order, num_stages, num_microbatches)])


def run_show(args: argparse.Namespace) -> int:
    print(render_show(args.name, args.stages, args.microbatches, args.with_comm))
    return 0


def run_list(args: argparse.Namespace) -> int:
    for name in schedule_names():
        print(f"{name:<8} {describe(name)}")
    return 0

