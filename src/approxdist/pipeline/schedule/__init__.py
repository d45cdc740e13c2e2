"""Pipeline schedules as data (seed 002; GPipe; 1F1B; zero bubble; PipeDream; 2BW): build, check, print.

    order = build_schedule("1f1b", num_stages=4, num_microbatches=8)  # validated
    order[r]  # the actions pipeline rank r (stage r) executes, in order
    sched = build_async_schedule("2bw", 4, 4, num_minibatches=3)  # not executable yet
    sched.versions[(r, i)]  # the weight version order[r][i] (a forward/backward) uses
"""

from approxdist.pipeline.schedule import (  # noqa: F401  (registers)
    gpipe,
    one_f_one_b,
    pipedream,
    two_bw,
    zero_bubble,
    zero_bubble_v,
)
from approxdist.pipeline.schedule.action import Action, Kind, Order, parse_actions
from approxdist.pipeline.schedule.check_versions import check_versions, validate_versions
from approxdist.pipeline.schedule.durations import StageDurations, StageTimes
from approxdist.pipeline.schedule.grid import format_grid, peak_in_flight, summary
from approxdist.pipeline.schedule.registry import (
    ASYNC_SCHEDULES,
    SCHEDULES,
    async_schedule_names,
    build_async_schedule,
    build_schedule,
    schedule_names,
)
from approxdist.pipeline.schedule.simulate import ActionTimes, Durations, Timeline, simulate
from approxdist.pipeline.schedule.validate import Violation, check_schedule, validate_schedule
from approxdist.pipeline.schedule.versions import AsyncSchedule, Stream, Update

__all__ = [
    "ASYNC_SCHEDULES",
    "Action",
    "ActionTimes",
    "AsyncSchedule",
    "Durations",
    "Kind",
    "Order",
    "SCHEDULES",
    "StageDurations",
    "StageTimes",
    "Stream",
    "Timeline",
    "Update",
    "Violation",
    "async_schedule_names",
    "build_async_schedule",
    "build_schedule",
    "check_schedule",
    "check_versions",
    "format_grid",
    "parse_actions",
    "peak_in_flight",
    "schedule_names",
    "simulate",
    "summary",
    "validate_schedule",
    "validate_versions",
]
