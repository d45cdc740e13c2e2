"""Pipeline parallelism (seeds 000, 002; GPipe; PipeDream-Flush): stages, schedules,
micro-batches. Pure parts only here; docs/pipeline.md describes the executor contract.
"""

from approxdist.pipeline.errors import PipelineError, ScheduleError
from approxdist.pipeline.microbatch import MicroBatch, split_batch, split_microbatches
from approxdist.pipeline.partition import Partition, plan_partition, stage_module
from approxdist.pipeline.schedule import Action, Kind, build_schedule

__all__ = [
    "Action", "Kind", "MicroBatch", "Partition", "PipelineError", "ScheduleError",
    "build_schedule", "plan_partition", "split_batch", "split_microbatches", "stage_module",
]
