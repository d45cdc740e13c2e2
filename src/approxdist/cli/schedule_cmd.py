"""`approxdist schedule show|list`: print a pipeline schedule as a grid, checked, no processes.

Zero-bubble schedules (zbh1, zbh2) print their split backwards as `I` (input gradient) and
`W` (weight gradient), with the idle steps left inside each rank's span.

Asynchronous schedules (pipedream, pipedream-vsync, 2bw) print here with the weight version
of every forward and backward; with `--replicas` (pipedream, 2bw) one row per rank, the
micro-batches dealt round robin and each stage's lockstep steps closed by `AR`; then each
rank's list as the executor runs it, its weight versions (`V`) and optimizer steps (`U`)
among the other actions (`schedule.program`).
"""

from __future__ import annotations

import argparse
from typing import Any

from approxdist.cli.groups import command_group
from approxdist.errors import unknown_name
from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule import build_schedule, format_grid, schedule_names, summary
from approxdist.pipeline.schedule.async_grid import LEGEND, async_summary, format_async_grid
from approxdist.pipeline.schedule.program import format_programs
from approxdist.pipeline.schedule.registry import (
    ASYNC_SCHEDULES,
    PLACEMENTS,
    SCHEDULES,
    async_schedule_names,
    build_async_schedule,
    describe,
    placement_of,
)
from approxdist.pipeline.schedule.replicated import check_dealing, replicated_schedule, slot_route
from approxdist.pipeline.schedule.zero_bubble import check_microbatches
from approxdist.topology import parse_replicas, replica_counts
from approxdist.topology.dealing import Dealing


def register(sub: Any) -> None:
    kinds = command_group(sub, "schedule", "show and check pipeline schedules",
                          "Pipeline schedules are data: print one as a time-step x rank grid "
                          "after validating it.")
    show = kinds.add_parser("show", help="print a schedule as a grid",
                            description="Validate the schedule and print its grid, the "
                                        "bubble fraction and peak in-flight activations.")
    show.add_argument("name", help=f"schedule name: {', '.join(schedule_names())}; asynchronous: "
                                   f"{', '.join(async_schedule_names())}")
    show.add_argument("--stages", "-p", type=int, required=True, metavar="P",
                      help="pipeline stages (= ranks without --replicas)")
    show.add_argument("--microbatches", "-m", type=int, required=True, metavar="M",
                      help="micro-batches per mini-batch")
    show.add_argument("--with-comm", action="store_true",
                      help="also show sends (SF, SB) and receive posts (RF, RB)")
    show.add_argument("--replicas", metavar="R|R0,R1,...",
                      help="replicated stages (hybrid): micro-batches dealt round robin to each "
                           "stage's replicas, one row per rank (stage-major), `AR` = gradient "
                           "all-reduce (asynchronous schedules: before each lockstep step)")
    show.add_argument("--minibatches", "-k", type=int, metavar="K",
                      help="asynchronous schedules: mini-batches in the stream, no flush between "
                           "them (default: the fewest that show every version rule)")
    show.set_defaults(func=run_show)
    lister = kinds.add_parser("list", help="list the schedule names")
    lister.set_defaults(func=run_list)


def render_show(name: str, num_stages: int, num_microbatches: int,
                with_comm: bool = False, replicas: str | None = None,
                minibatches: int | None = None) -> str:
    """The text `schedule show` prints; raises `ScheduleError`/`PipelineError` on bad input."""
    if name in ASYNC_SCHEDULES:
        return render_async(name, num_stages, num_microbatches, with_comm, minibatches, replicas)
    if name not in SCHEDULES:
        raise ScheduleError(unknown_name("schedule", name, schedule_names()
                                         + async_schedule_names()))
    if minibatches is not None:
        raise ScheduleError(f"--minibatches {minibatches}: {name} flushes after every "
                            f"mini-batch, so it shows one; streams are for the asynchronous "
                            f"schedules ({', '.join(async_schedule_names())})")
    check_microbatches(name, num_stages, num_microbatches)
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
    if name in PLACEMENTS:  # several chunks per rank: messages between ranks
        place = placement_of(name, num_stages)
        chunks = len(place.replicas)
        head = (f"schedule {name}: {num_stages} ranks holding {chunks} chunks "
                f"(chunk -> rank {','.join(map(str, place.ranks or ()))}), "
                f"{num_microbatches} micro-batches; valid")
        return "\n".join([head, format_grid(order, chunks, with_comm, slot_route(place)),
                          summary(order, chunks, num_microbatches, slot_route(place),
                                  per="rank")])
    head = (f"schedule {name}: {num_stages} stages (one per rank), "
            f"{num_microbatches} micro-batches; valid")
    return "\n".join([head, format_grid(order, num_stages, with_comm),
                      summary(order, num_stages, num_microbatches)])


def render_async(name: str, num_stages: int, num_microbatches: int,
                 with_comm: bool = False, minibatches: int | None = None,
                 replicas: str | None = None) -> str:
    """`schedule show` of an asynchronous schedule: grid with weight versions and summary."""
    counts = replica_counts(num_stages, parse_replicas(replicas)) if replicas else ()
    dealing = Dealing(counts) if counts and max(counts) > 1 else None
    sched = build_async_schedule(name, num_stages, num_microbatches, minibatches,
                                 dealing=dealing)
    k = sched.stream.minibatches
    ranks = (f"replicas {','.join(map(str, counts))} ({sum(counts)} ranks, stage-major, "
             f"micro-batches dealt round robin)" if dealing is not None else "one per rank")
    head = (f"schedule {name} (asynchronous: no flush between mini-batches; train streams "
            f"each epoch): {num_stages} stages ({ranks}), a stream of {k} mini-batches x "
            f"{num_microbatches} micro-batches = {sched.stream.items}; valid, with versions")
    return "\n".join([head, LEGEND, format_async_grid(sched, with_comm), async_summary(sched),
                      format_programs(sched, with_comm)])


def run_show(args: argparse.Namespace) -> int:
    print(render_show(args.name, args.stages, args.microbatches, args.with_comm, args.replicas,
                      args.minibatches))
    return 0


def run_list(args: argparse.Namespace) -> int:
    names = schedule_names() + async_schedule_names()
    width = max(map(len, names))
    for name in schedule_names():
        print(f"{name:<{width}} {describe(name)}")
    for name in async_schedule_names():
        print(f"{name:<{width}} {describe(name)} (asynchronous)")
    return 0

