"""One server step and one worker step of a `PSNode`, traced and timed: what
`approxdist.ParameterServer` runs for a user's loop and the trainer's engine alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from approxdist.param_server.node import PSNode
from approxdist.trace.phases import SYNC
from approxdist.trace.recorder import Recorder
from approxdist.trace.step import traced_backward
from approxdist.trace.times import StepTimes

LossFn = Callable[[Any, Any], torch.Tensor]


@dataclass(frozen=True)
class WorkerStep:
    """One worker step: the loss, the model's output (for the caller's scores), how many
    of the following steps this worker skips (N+b) and where its time went."""

    loss: torch.Tensor
    output: Any
    skip: int
    times: StepTimes


def serve_step(node: PSNode, rec: Recorder) -> dict[str, object]:
    """One step of the node's server: its log as a record, and every push in arrival order
    as a `push` marker in the trace (a replay's input)."""
    assert node.server is not None
    with rec.span(SYNC):
        log = node.serve_step()
    for worker, read, at in log.order:
        rec.instant("push", worker=worker, read=read, at=at)
    return log.record(node.server.rules.version)


def worker_step(node: PSNode, loss_fn: LossFn, rec: Recorder, inputs: Any,
                targets: Any) -> WorkerStep:
    """Forward, `loss_fn(model(inputs), targets)`, backward on the node's model, then push
    the gradients and pull the parameters."""
    module = node.module
    t0 = time.perf_counter()
    output, loss = traced_backward(rec, module, loss_fn, inputs, targets,
                                   lambda: module.zero_grad(set_to_none=True))
    t1 = time.perf_counter()
    with rec.span(SYNC):
        skip = node.push_pull()
    t2 = time.perf_counter()
    return WorkerStep(loss.detach(), output, skip,
                      StepTimes(compute_s=t1 - t0, wait_s=t2 - t1, wall_s=t2 - t0))
