"""`approxdist schedule show|list`: print a pipeline schedule as a grid, checked, no processes."""

from __future__ import annotations

import argparse
from typing import Any

from approxdist.cli.groups import command_group
from approxdist.pipeline.schedule import build_schedule, format_grid, schedule_names, summary
from approxdist.pipeline.schedule.registry import describe
from approxdist.pipeline.schedule.replicated import check_dealing, replicated_schedule, slot_route
from approxdist.topology import parse_replicas
from approxdist.topology.dealing import Dealing
from approxdist.topology.layout import replica_counts


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
    show.add_argument("--replicas", metavar="R|R0,R1,...",
                      help="replicated stages (hybrid): micro-batches dealt round robin to each "
                           "stage's replicas, one row per rank (stage-major), `AR` = gradient "
                           "all-reduce")
    show.set_defaults(func=run_show)
    lister = kinds.add_parser("list", help="list the schedule names")
    lister.set_defaults(func=run_list)


def render_show(name: str, num_stages: int, num_microbatches: int,
                with_comm: bool = False, replicas: str | None = None) -> str:
    """The text `schedule show` prints; raises `ScheduleError`/`PipelineError` on bad input."""
    if replicas:
        counts = replica_counts(num_stages, parse_replicas(replicas))
        dealing = Dealing(counts)
        check_dealing(dealing, num_microbatches)
        order = replicated_schedule(name, dealing, num_microbatches)
        route = slot_route(dealing)
        head = (f"schedule {name}: {num_stages} stages, replicas {','.join(map(str, counts))} "
                f"({sum(counts)} ranks, stage-major), {num_microbatches} micro-batches dealt "
                f"round robin; valid")
        return "\n".join([head, format_grid(order, num_stages, with_comm, route),
                          summary(order, num_stages, num_microbatches, route, per="rank")])
    order = build_schedule(name, num_stages, num_microbatches)
    head = (f"schedule {name}: {num_stages} stages (one per rank), "
            f"{num_microbatches} micro-batches; valid")
    return "\n".join([head, format_grid(order, num_stages, with_comm),
                      summary(order, num_stages, num_microbatches)])


def run_show(args: argparse.Namespace) -> int:
    print(render_show(args.name, args.stages, args.microbatches, args.with_comm, args.replicas))
    return 0


def run_list(args: argparse.Namespace) -> int:
    for name in schedule_names():
        print(f"{name:<8} {describe(name)}")
    return 0

