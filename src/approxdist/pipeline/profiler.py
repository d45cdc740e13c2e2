"""Per-block profilers that feed the partition solvers (torchgpipe's balance_by_time; the planner).

Kept apart from `partition` so the solvers stay pure: this module measures, the solvers
only see numbers. Seed 002: the partitioner works from a profile of per-layer compute
time, activation size and parameter size. `measure_blocks` gives each block's forward
and backward seconds, output bytes, parameter bytes and the bytes autograd keeps for its
backward; `profile_times` is their forward + backward time alone.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.partition import blocks_of


@dataclass(frozen=True)
class BlockMeasure:
    """One block at the sample's batch: median seconds and bytes (`stash_bytes`: the
    tensors autograd saved for its backward, parameters not counted)."""

    name: str
    fwd_s: float
    bwd_s: float
    out_bytes: int
    param_bytes: int
    stash_bytes: int


#: timed runs per block (the median is kept). Three were too few on a shared 2-core
#: machine: with 3, one of mlp-wide's 1024-wide layers read its backward 2.3x (3 ms for 1.3)
#: in 3 of 5 profiles in a row, which moves a stage by a quarter; with 9 the sum of the
#: backwards stayed within 6 % over 5 profiles (2026-11-27, docs/planner.md)
REPEAT = 9


def measure_blocks(model: nn.Module, sample: Any, repeat: int = REPEAT,
                   warmup: int = 1) -> list[BlockMeasure]:
    """Each block of an `nn.Sequential` fed the previous block's output: median forward
    and backward seconds over `repeat` runs after `warmup`, and its bytes.

    Each block runs on a deep copy, so the model's parameters, gradients and batch-norm
    statistics are left as they were. `sample` is a tensor or tuple of tensors.
    """
    if repeat < 1 or warmup < 0:
        raise PipelineError(f"repeat ({repeat}) must be >= 1 and warmup ({warmup}) >= 0")
    out: list[BlockMeasure] = []
    x = sample
    for name, block in blocks_of(model).named_children():
        probe = copy.deepcopy(block)
        runs = [_forward_backward(probe, x) for _ in range(warmup + repeat)][warmup:]
        stash, y = _stashed_bytes(probe, x)
        out.append(BlockMeasure(
            name=f"{name} {type(block).__name__}", fwd_s=_median([f for f, _ in runs]),
            bwd_s=_median([b for _, b in runs]), out_bytes=sum(_nbytes(t) for t in _tensors(y)),
            param_bytes=sum(_nbytes(p) for p in block.parameters()), stash_bytes=stash))
        x = _detach(y)
    return out


def profile_times(model: nn.Module, sample: Any, repeat: int = REPEAT,
                  warmup: int = 1) -> list[float]:
    """Median seconds of forward + backward of each block (`measure_blocks`' times)."""
    return [m.fwd_s + m.bwd_s for m in measure_blocks(model, sample, repeat, warmup)]


def _forward_backward(block: nn.Module, x: Any) -> tuple[float, float]:
    """(forward seconds, backward seconds) of one run on a fresh leaf input, starting
    without gradients as a training step does after `zero_grad()` (set to None): the
    backward writes them instead of adding into the last run's (an extra pass over every
    weight, 1.7x a 1024-wide MLP's measured step here)."""
    block.zero_grad(set_to_none=True)
    inputs = _leaf(x)
    t0 = time.perf_counter()
    y = block(inputs)
    _sync(y)
    t1 = time.perf_counter()
    outs = [t for t in _tensors(y) if t.requires_grad]
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    _sync(y)
    return t1 - t0, time.perf_counter() - t1


def _stashed_bytes(block: nn.Module, x: Any) -> tuple[int, Any]:
    """Bytes of the distinct tensors autograd saves in one forward (parameters excluded),
    and that forward's output."""
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = block(_leaf(x))
    return total, y


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


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
