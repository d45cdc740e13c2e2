"""Schedules by name: each is a pure function (stages, micro-batches) -> actions per rank.

A new schedule is one new module that decorates its function with
`@SCHEDULES.register("name")` and is imported in `schedule/__init__.py`; the validator
and the executor do not change (design principle 5, "schedules are data").

Asynchronous schedules (PipeDream, PipeDream-2BW: no flush between mini-batches, weight
versions per stage) live in a registry of their own, `ASYNC_SCHEDULES`, built by
`build_async_schedule` over a stream of mini-batches; the executor runs one rank's stream
as a program (`schedule.program`: its weight versions and optimizer steps as actions)
a piece per trainer step. `build_schedule` hands out one flushed mini-batch and refuses
their names with `asynchronous_refusal`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from approxdist.pipeline.errors import PipelineError, ScheduleError
from approxdist.pipeline.schedule.action import Order
from approxdist.pipeline.schedule.check_versions import validate_versions
from approxdist.pipeline.schedule.validate import validate_schedule
from approxdist.pipeline.schedule.versions import AsyncSchedule, Stream
from approxdist.registry import Registry
from approxdist.topology.dealing import Dealing

#: (num_stages, num_microbatches) -> rank -> actions, including sends and receives
ScheduleFn = Callable[[int, int], Order]
#: (num_stages, stream, replicated stages or None) -> actions per slot with the weight
#: version of each forward/backward
AsyncScheduleFn = Callable[[int, Stream, Dealing | None], AsyncSchedule]

SCHEDULES: Registry[ScheduleFn] = Registry("schedule", ScheduleError)
#: schedules whose ranks hold several chunks: name -> (pipeline ranks -> chunk placement)
PLACEMENTS: dict[str, Callable[[int], Dealing]] = {}


def register_placement(name: str, placement: Callable[[int], Dealing]
                       ) -> Callable[[ScheduleFn], ScheduleFn]:
    """`@register_placement("zbv", Dealing.v)`: schedule `name` runs chunks placed so."""
    def deco(fn: ScheduleFn) -> ScheduleFn:
        PLACEMENTS[name] = placement
        return fn

    return deco


def placement_of(name: str, num_ranks: int) -> Dealing:
    """Which rank holds each stage (chunk) of schedule `name` on `num_ranks` pipeline ranks:
    one stage per rank, or the schedule's chunk placement (ZB-V's V)."""
    return PLACEMENTS[name](num_ranks) if name in PLACEMENTS else Dealing.single(num_ranks)


def num_chunks(name: str, num_ranks: int) -> int:
    """How many pieces schedule `name` cuts the model into on `num_ranks` ranks."""
    return len(placement_of(name, num_ranks).replicas)


@dataclass(frozen=True)
class AsyncEntry:
    """An asynchronous schedule and the shortest stream (in mini-batches) whose grid shows
    every one of its version rules, `schedule show`'s default."""

    build: AsyncScheduleFn
    default_minibatches: int


ASYNC_SCHEDULES: Registry[AsyncEntry] = Registry("asynchronous schedule", ScheduleError)


def register_async(name: str, default_minibatches: int) -> Callable[[AsyncScheduleFn],
                                                                     AsyncScheduleFn]:
    """`@register_async("pipedream", 2)`: add an asynchronous schedule to `ASYNC_SCHEDULES`."""
    def deco(fn: AsyncScheduleFn) -> AsyncScheduleFn:
        ASYNC_SCHEDULES.add(name, AsyncEntry(fn, default_minibatches))
        return fn

    return deco


def schedule_names() -> list[str]:
    """The schedules the executor runs (flushed after every mini-batch)."""
    return SCHEDULES.names()


def async_schedule_names() -> list[str]:
    """The asynchronous schedules: printable and checkable, not executable yet."""
    return ASYNC_SCHEDULES.names()


def describe(name: str) -> str:
    """The first line of the schedule function's docstring (either registry)."""
    fn = ASYNC_SCHEDULES.get(name).build if name in ASYNC_SCHEDULES else SCHEDULES.get(name)
    doc = fn.__doc__ or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def asynchronous_refusal(name: str) -> str:
    """Why the flushed executor's entry point does not hand out an asynchronous schedule."""
    return (f"{name!r} is an asynchronous schedule (no flush between mini-batches, weight "
            f"versions per stage): build it with build_async_schedule over a stream of "
            f"mini-batches (the executor runs it as a stream program, schedule.program), or use one of "
            f"{', '.join(schedule_names())}")


def check_sizes(num_stages: int, num_microbatches: int) -> None:
    """Both counts must be positive integers (raises `PipelineError` naming the value)."""
    for what, value in (("stages", num_stages), ("micro-batches", num_microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PipelineError(f"{what} ({value!r}) must be an integer >= 1")


def build_schedule(name: str, num_stages: int, num_microbatches: int,
                   validate: bool = True) -> Order:
    """The named schedule for P stages and M micro-batches, checked by the validator.

    `order[r]` is the list of actions pipeline rank `r` (which runs stage `r`, or with a
    chunked schedule such as zbv the chunks `placement_of(name, P)` gives it) executes;
    pipeline ranks are positions in the pipeline's group, mapped to global ranks by the
    topology. An asynchronous schedule's name raises `ScheduleError` (see the module doc).
    """
    if name not in SCHEDULES and name in ASYNC_SCHEDULES:
        raise ScheduleError(asynchronous_refusal(name))
    fn = SCHEDULES.get(name)
    check_sizes(num_stages, num_microbatches)
    order = fn(num_stages, num_microbatches)
    if validate:
        placement = PLACEMENTS[name](num_stages) if name in PLACEMENTS else None
        validate_schedule(order, num_stages if placement is None else len(placement.replicas),
                          num_microbatches, placement)
    return order


def build_async_schedule(name: str, num_stages: int, num_microbatches: int,
                         num_minibatches: int | None = None, validate: bool = True,
                         dealing: Dealing | None = None) -> AsyncSchedule:
    """The named asynchronous schedule over a stream of K mini-batches of M micro-batches
    (K defaults to the entry's `default_minibatches`), checked by `check_versions`. With
    `dealing` (replicated stages) its lists are per slot (`versions`, module doc)."""
    entry = ASYNC_SCHEDULES.get(name)
    check_sizes(num_stages, num_microbatches)
    if dealing is not None:
        check_rounds(name, dealing, num_stages, num_microbatches)
    stream = Stream(num_microbatches, entry.default_minibatches if num_minibatches is None
                    else num_minibatches)
    schedule = entry.build(num_stages, stream, dealing)
    if validate:
        validate_versions(schedule)
    return schedule


def check_rounds(name: str, dealing: Dealing, num_stages: int, num_microbatches: int) -> None:
    """An asynchronous schedule on replicated stages steps each stage in whole rounds of its
    replicas, so M must be a multiple of every replica count (`ScheduleError` otherwise)."""
    if len(dealing.replicas) != num_stages:
        raise ScheduleError(f"replicas {','.join(map(str, dealing.replicas))} name "
                            f"{len(dealing.replicas)} stages, not {num_stages}")
    rounds = math.lcm(*dealing.replicas)
    if num_microbatches % rounds:
        low = rounds * max(1, num_microbatches // rounds)
        high = rounds * (num_microbatches // rounds + 1)
        raise ScheduleError(f"{name} with replicas {','.join(map(str, dealing.replicas))} "
                            f"steps each stage once per round of its replicas: micro-batches "
                            f"({num_microbatches}) must be a multiple of {rounds}; try "
                            f"{low} or {high if high > low else low + rounds}")
