"""Schedules by name: each is a pure function (stages, micro-batches) -> actions per rank.

A new schedule is one new module that decorates its function with
`@SCHEDULES.register("name")` and is imported in `schedule/__init__.py`; the validator
and the executor do not change (design principle 5, "schedules are data").
"""

from __future__ import annotations

from collections.abc import Callable

from approxdist.pipeline.errors import PipelineError, ScheduleError
from approxdist.pipeline.schedule.action import Order
from approxdist.pipeline.schedule.validate import validate_schedule
from approxdist.registry import Registry

#: (num_stages, num_microbatches) -> rank -> actions, including sends and receives
ScheduleFn = Callable[[int, int], Order]

SCHEDULES: Registry[ScheduleFn] = Registry("schedule", ScheduleError)


def schedule_names() -> list[str]:
    return SCHEDULES.names()


def describe(name: str) -> str:
    """The first line of the schedule function's docstring."""
    doc = SCHEDULES.get(name).__doc__ or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def check_sizes(num_stages: int, num_microbatches: int) -> None:
    """Both counts must be positive integers (raises `PipelineError` naming the value)."""
    for what, value in (("stages", num_stages), ("micro-batches", num_microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PipelineError(f"{what} ({value!r}) must be an integer >= 1")


def build_schedule(name: str, num_stages: int, num_microbatches: int,
                   validate: bool = True) -> Order:
    """The named schedule for P stages and M micro-batches, checked by the validator.

    `order[r]` is the list of actions pipeline rank `r` (which runs stage `r`) executes;
    pipeline ranks are positions in the pipeline's group, mapped to global ranks by the
    topology.
    """
    fn = SCHEDULES.get(name)
    check_sizes(num_stages, num_microbatches)
    order = fn(num_stages, num_microbatches)
    if validate:
        validate_schedule(order, num_stages, num_microbatches)
    return order
