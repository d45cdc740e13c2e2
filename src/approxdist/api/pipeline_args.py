"""`approxdist.Pipeline`'s keyword arguments checked and turned into the config sections the
pipeline and data-parallel layers take (one `ConfigError` line each)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from approxdist.config.dp import DPConfig
from approxdist.config.pipeline import PipelineConfig
from approxdist.config.wire import Wire, WireConfig
from approxdist.errors import ConfigError
from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.schedule import async_schedule_names, schedule_names
from approxdist.pipeline.schedule.registry import build_async_schedule
from approxdist.pipeline.stream_state import OptimizerFactory
from approxdist.topology.dealing import Dealing


def check_schedule(schedule: str, optimizer: OptimizerFactory | None, stream: int) -> bool:
    """Whether `schedule` is asynchronous; it needs `optimizer=` and `stream=` then, and
    refuses them otherwise."""
    names = schedule_names() + async_schedule_names()
    if schedule not in names:
        raise ConfigError(f"schedule {schedule!r} is not one of: {', '.join(names)}")
    asynchronous = schedule in async_schedule_names()
    if asynchronous and (optimizer is None or stream < 1):
        raise ConfigError(f"schedule {schedule!r} is asynchronous: it steps the optimiser "
                          f"inside the stream; pass optimizer=lambda params: "
                          f"torch.optim.SGD(params, lr=...) and stream=K (mini-batches "
                          f"between two flushes, e.g. the steps of an epoch)")
    if not asynchronous and (optimizer is not None or stream):
        raise ConfigError(f"schedule {schedule!r} flushes after every mini-batch: step "
                          f"your own optimiser over pipe.parameters(); optimizer= and "
                          f"stream= are for asynchronous schedules")
    return asynchronous


def replica_counts(replicas: int | Sequence[int], stages: int | None,
                   world: int) -> tuple[int, ...]:
    """Ranks per stage, () for one each: a count per stage, or one count for every stage
    (then the world must divide into stages of that many)."""
    if isinstance(replicas, int):
        if replicas == 1:
            return ()
        if replicas < 1 or world % replicas:
            raise ConfigError(f"replicas={replicas} must be >= 1 and divide the world of "
                              f"{world} ranks, or give one count per stage, e.g. (2, 1)")
        counts = (replicas,) * (stages or world // replicas)
    else:
        counts = tuple(int(r) for r in replicas)
        if stages is not None and stages != len(counts):
            raise ConfigError(f"replicas={list(counts)} names {len(counts)} stage(s) but "
                              f"stages={stages}; give one count per stage")
    if sum(counts) != world or any(r < 1 for r in counts):
        raise ConfigError(f"replicas={list(counts)} place {sum(counts)} rank(s) but the world "
                          f"has {world}; the counts (each >= 1) must add up to the world size")
    return counts if max(counts) > 1 else ()


def check_async_replicas(schedule: str, counts: tuple[int, ...], microbatches: int) -> None:
    """An asynchronous schedule's rules on replicated stages, as one line (docs/pipeline.md)."""
    try:
        build_async_schedule(schedule, len(counts), microbatches, 1, dealing=Dealing(counts))
    except ScheduleError as exc:
        raise ConfigError(f"schedule {schedule!r} on replicas={list(counts)}: {exc}") from None


def dp_section(replicated: bool, grad_codec: str, algorithm: str, calibration: str
               ) -> tuple[DPConfig, Wire]:
    """The replicas' reducer and their gradient wire; refused without replicas, never
    ignored."""
    dp, grad = DPConfig(algorithm=algorithm, calibration=calibration), Wire(codec=grad_codec)
    if not replicated and (dp != DPConfig() or grad != Wire()):
        raise ConfigError(f"grad_codec={grad_codec!r}, algorithm={algorithm!r} and "
                          f"calibration={calibration!r} set how a replicated stage's gradients "
                          f"are summed, and this pipeline has no replicated stage; pass "
                          f"replicas= or leave them out")
    return dp, grad


def wires(grad: Wire, fwd_codec: str, bwd_codec: str, fwd_channel: str,
          bwd_channel: str) -> WireConfig:
    """The pipeline's three wires from the arguments."""
    return WireConfig(grad=grad, fwd=Wire(codec=fwd_codec, channel=fwd_channel),
                      bwd=Wire(codec=bwd_codec, channel=bwd_channel))


def pipeline_section(stages: int, split: str | Sequence[int], **keys: Any) -> PipelineConfig:
    """`[pipeline]` from the arguments (a split as a list of block indices too)."""
    cut = split if isinstance(split, str) else ",".join(str(int(b)) for b in split)
    return PipelineConfig(stages=stages, split=cut, **keys)
