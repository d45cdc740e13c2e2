"""Pipeline schedules as data (seed 002; GPipe; PipeDream-Flush): build, check, print.

    order = build_schedule("1f1b", num_stages=4, num_microbatches=8)  # validated
    order[r]  # the actions pipeline rank r (stage r) executes, in order
"""

from approxdist.pipeline.schedule import gpipe, one_f_one_b  # noqa: F401  (registers)
from approxdist.pipeline.schedule.action import Action, Kind, Order, parse_actions
from approxdist.pipeline.schedule.durations import StageDurations, StageTimes
from approxdist.pipeline.schedule.grid import format_grid, peak_in_flight, summary
from approxdist.pipeline.schedule.registry import (
    SCHEDULES,
    build_schedule,
    schedule_names,
)
from approxdist.pipeline.schedule.simulate import ActionTimes, Durations, Timeline, simulate
from approxdist.pipeline.schedule.validate import Violation, check_schedule, validate_schedule

__all__ = [
    "SCHEDULES", "Action", "ActionTimes", "Durations", "Kind", "Order", "StageDurations",
    "StageTimes", "Timeline", "Violation", "build_schedule", "check_schedule", "format_grid",
    "parse_actions", "peak_in_flight", "schedule_names", "simulate", "summary",
    "validate_schedule",
]
