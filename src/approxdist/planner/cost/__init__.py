"""The planner's cost model: links, codecs, all-reduces, step times and memory of a plan; pure.

- `links`: `LinkLevel` (alpha, beta, gamma per level: intra, inter, loopback), `Network`.
- `codecs`: `CodecCost` (exact wire bytes, coding seconds, break-even bandwidth).
- `collectives`: our all-reduce algorithms' critical-path steps and times (Thakur et al.).
- `calibration`, `calibration_file`: fit a level to `bench allreduce` and p2p rows; the file.
- `rows`: read the JSON rows `approxdist bench ... --json` writes.
- `dp`: data-parallel step time (buckets overlapped with backward).
- `pipeline`: GPipe / 1F1B / hybrid step time through the pipeline package's `simulate`.
- `memory`: parameters, gradients, optimizer state and activations in flight per stage.
- `optimizer_step`: the optimizer's step after a flush, per parameter byte and per tensor.

docs/planner.md ("Cost model") has the equations and a worked example.
"""

from approxdist.planner.cost.calibration import FITTED, Fit, fit_level
from approxdist.planner.cost.calibration_file import CostCalibration
from approxdist.planner.cost.codecs import CodecCost, codec_costs_from_bench, read_bench_codec
from approxdist.planner.cost.collectives import (
    Step,
    allreduce_steps,
    allreduce_time,
    fastest,
    total,
)
from approxdist.planner.cost.dp import BucketTime, DPOptions, DPTime, dp_time
from approxdist.planner.cost.links import LEVELS, LinkLevel, Network
from approxdist.planner.cost.memory import OPTIMIZER_STATES, StageMemory, stage_memory
from approxdist.planner.cost.pipeline import (
    Boundary,
    PipelinePlan,
    PipelineTime,
    Stage,
    boundary,
    pipeline_time,
    replica_allreduce_s,
    stage_durations,
)
from approxdist.planner.cost.rows import read_rows

__all__ = [
    "FITTED", "LEVELS", "OPTIMIZER_STATES", "Boundary", "BucketTime", "CodecCost",
    "CostCalibration", "DPOptions", "DPTime", "Fit", "LinkLevel", "Network", "PipelinePlan",
    "PipelineTime", "Stage", "StageMemory", "Step", "allreduce_steps", "allreduce_time",
    "boundary", "codec_costs_from_bench", "dp_time", "fastest", "fit_level", "pipeline_time",
    "read_bench_codec", "read_rows", "replica_allreduce_s", "stage_durations", "stage_memory",
    "total",
]
