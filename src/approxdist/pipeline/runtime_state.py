"""A pipeline rank's state, saved and restored: its stage's module, the optimiser an
asynchronous schedule steps, the replicas' reducer state (checkpoints)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.runtime import PipelineRuntime


def stage_state(runtime: PipelineRuntime, optimizer: torch.optim.Optimizer | None,
                schedule: str) -> dict[str, Any]:
    """The stage's module and cut, `optimizer`'s state (when given) and the replicas'
    reducer state (a collective over the stage's replicas); refused inside a stream."""
    stream = runtime.executor.stream
    if stream is not None and stream.in_stream:
        raise PipelineError(f"stage {runtime.stage} is inside a stream of {schedule} with "
                            f"micro-batches in flight; save at the end of the stream")
    sync = runtime.grad_sync
    return {"model": runtime.module.state_dict(),
            "boundaries": list(runtime.partition.boundaries),
            **({"optimizer": optimizer.state_dict()} if optimizer else {}),
            "dp": sync.checkpoint_state() if sync is not None else {}}


def load_stage_state(runtime: PipelineRuntime, optimizer: torch.optim.Optimizer | None,
                     state: Mapping[str, Any]) -> None:
    """Put a `stage_state` back, refusing one of another cut."""
    cut = tuple(state["boundaries"])
    if cut != runtime.partition.boundaries:
        raise PipelineError(f"the state of stage {runtime.stage} was cut at {cut}, this "
                            f"pipeline at {runtime.partition.boundaries}; load it into "
                            f"a pipeline of the original split")
    runtime.module.load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    if runtime.grad_sync is not None:
        runtime.grad_sync.load_checkpoint_state(state.get("dp", {}))
