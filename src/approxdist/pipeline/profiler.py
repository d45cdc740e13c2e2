"""Per-block profilers that feed the partition solver (torchgpipe's balance_by_time).

Kept apart from `partition` so the solver stays pure: `profile_times` measures, the
solver only sees a list of numbers. Seed 002: the partitioner works from a profile of
per-layer compute time.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import nn

from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.partition import blocks_of


def profile_times(model: nn.Module, sample: Any, repeat: int = 3, warmup: int = 1) -> list[float]:
    """Median seconds of forward + backward of each block, fed the previous block's output.

    Each block runs on a deep copy, so the model's parameters, gradients and batch-norm
    statistics are left as they were. `sample` is a tensor or tuple of tensors.
    """
    if repeat < 1 or warmup < 0:
        raise PipelineError(f"repeat ({repeat}) must be >= 1 and warmup ({warmup}) >= 0")
    times: list[float] = []
    x = sample
    for block in blocks_of(model):
        probe = copy.deepcopy(block)
        runs = []
        for _ in range(warmup + repeat):
            t0 = time.perf_counter()
            y = _forward_backward(probe, x)
            runs.append(time.perf_counter() - t0)
        times.append(sorted(runs[warmup:])[len(runs[warmup:]) // 2])
        x = _detach(y)
    return times


def _forward_backward(block: nn.Module, x: Any) -> Any:
    inputs = _leaf(x)
    y = block(inputs)
    outs = [t for t in _tensors(y) if t.requires_grad]
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    _sync(y)
    return y


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _tensors(item)]
    return []


def _leaf(x: Any) -> Any:
    """A fresh autograd leaf (floating tensors require grad, like a stage's received input)."""
    if isinstance(x, torch.Tensor):
        return x.detach().requires_grad_(x.is_floating_point())
    if isinstance(x, (tuple, list)):
        return type(x)(_leaf(item) for item in x)
    return x


def _detach(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (tuple, list)):
        return type(x)(_detach(item) for item in x)
    return x


def _sync(y: Any) -> None:
    """Wait for queued GPU work so the clock measures it (nothing to do on CPU)."""
    for t in _tensors(y):
        if t.is_cuda:
            torch.cuda.synchronize(t.device)
            return
