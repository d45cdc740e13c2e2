"""Per-block profilers that feed the partition solvers (torchgpipe's balance_by_time; the planner).

Kept apart from `partition` so the solvers stay pure: this module measures, the solvers
only see numbers. Seed 002: the partitioner works from a profile of per-layer compute
time, activation size and parameter size. `measure_blocks` gives each block's forward
and backward seconds (timed in context: inside passes of the whole model), its backward's
two halves as a zero-bubble stage splits it (`I`, `W`: `split_backward`), what its
backward adds when accumulating into existing gradients, output bytes, parameter bytes
and the bytes autograd keeps for its backward; `profile_times` is forward + backward.
"""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Any

import torch
from torch import nn

from approxdist.pipeline.accumulate import MODES as FUSION_MODES
from approxdist.pipeline.accumulate import WeightGradFusion
from approxdist.pipeline.block_profile import BlockProfile
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.partition import blocks_of
from approxdist.pipeline.split_backward import WeightGrad, input_grad

#: timed runs per block (the median is kept). Three were too few on a shared 2-core
#: machine: with 3, one of mlp-wide's 1024-wide layers read its backward 2.3x (3 ms for 1.3)
#: in 3 of 5 profiles in a row, which moves a stage by a quarter; with 9 the sum of the
#: backwards stayed within 6 % over 5 profiles (2026-11-27, docs/planner.md)
REPEAT = 9


def measure_blocks(model: nn.Module, sample: Any, repeat: int = REPEAT,
                   warmup: int = 1, fuse_accumulation: str = "auto") -> list[BlockProfile]:
    """Each block of an `nn.Sequential` timed *in context*: the whole model runs forward
    and backward on `sample`, and each block's share is read off clock marks at its
    boundaries (a hook on each block's output marks when its gradient arrived, which is
    where the block's backward starts). Medians over `repeat` passes after `warmup`.

    In context, not alone: a block run alone again and again finds its weights and input
    in cache, and its input requiring a gradient; in a step, the weights were last touched
    a whole forward earlier and the model's input needs none. Alone, mlp-wide's (6 x 1024)
    backwards summed to 0.83x the whole model's and resnet20's forwards to 0.88x
    (2026-11-27, docs/planner.md); in context the blocks sum to the model's pass.

    Each pass of the timed pairs starts without gradients, as a step does after
    `zero_grad(set_to_none=True)`; the second of each pair adds into the first's, which
    gives `acc_s` (the median of the pairs' differences per block, >= 0). The adding pass
    runs as a pipeline stage runs it: with `fuse_accumulation` (`accumulate.MODES`, the
    stage's `pipeline.fuse_accumulation`), large `nn.Linear` layers add their weight
    gradient with one `addmm_` instead of a GEMM and a pass of `AccumulateGrad`. A third
    pass splits the backward as a zero-bubble stage that is not the first does (`_split_pass`):
    each block's `I` (`input_s`) and `W` (`weight_s`). Runs on a deep copy, so the model's
    parameters, gradients and batch-norm statistics are left as they were. `sample` is a
    tensor or tuple of tensors.
    """
    if repeat < 1 or warmup < 0:
        raise PipelineError(f"repeat ({repeat}) must be >= 1 and warmup ({warmup}) >= 0")
    if fuse_accumulation not in FUSION_MODES:
        raise PipelineError(f"fuse_accumulation = {fuse_accumulation!r} is not one of: "
                            f"{', '.join(FUSION_MODES)}")
    probe = copy.deepcopy(blocks_of(model))
    smallest = FUSION_MODES[fuse_accumulation]
    fusion = WeightGradFusion(probe, smallest) if smallest is not None else None
    fused = fusion.active if fusion is not None else contextlib.nullcontext
    pairs, splits = [], []
    for _ in range(warmup + repeat):
        fresh = _timed_pass(probe, sample, fresh=True)  # outside `active()`: plain autograd
        with fused():
            pairs.append((fresh, _timed_pass(probe, sample, fresh=False)))
        splits.append(_split_pass(probe, sample))
    pairs, splits = pairs[warmup:], splits[warmup:]
    out: list[BlockProfile] = []
    x = sample
    opens = not any(t.is_floating_point() for t in _tensors(sample))  # token ids: see above
    for i, (name, block) in enumerate(probe.named_children()):
        fwd = _median([run[0][i] for pair in pairs for run in pair])
        bwd = _median([f[1][i] for f, _ in pairs])
        whole = opens and i == 0
        stash, y = _stashed_bytes(block, x)
        sizes = tuple(_nbytes(p) for p in block.parameters())
        out.append(BlockProfile(
            name=f"{name} {type(block).__name__}", fwd_s=fwd, bwd_s=bwd,
            out_bytes=sum(_nbytes(t) for t in _tensors(y)),
            param_bytes=sum(sizes), stash_bytes=stash, param_sizes=sizes,
            acc_s=max(0.0, _median([a[1][i] - f[1][i] for f, a in pairs])),
            input_s=0.0 if whole else _median([run[0][i] for run in splits]),
            weight_s=bwd if whole else _median([run[1][i] for run in splits])))
        x = _detach(y)
    return out


def profile_times(model: nn.Module, sample: Any, repeat: int = REPEAT,
                  warmup: int = 1) -> list[float]:
    """Median seconds of forward + backward of each block (`measure_blocks`' times)."""
    return [m.fwd_s + m.bwd_s for m in measure_blocks(model, sample, repeat, warmup)]


def pass_cpu_s(model: nn.Module, sample: Any, repeat: int = REPEAT, warmup: int = 1,
               min_s: float = 0.0) -> float:
    """Median CPU seconds this process spends on one forward + backward of the whole model
    on `sample` (fresh gradients, as `measure_blocks` runs it, on a deep copy), over at
    least `repeat` passes and at least `min_s` CPU seconds of them after `warmup` (a 2 ms
    pass needs many to average the machine's moments). Alone, a pass's CPU seconds are
    its wall seconds; with other processes on the same cores the wall seconds include
    their turns, the CPU seconds only what the pass itself cost (more where they evict its
    caches). CPU work only: a GPU's is not counted."""
    if repeat < 1 or warmup < 0 or not min_s >= 0:
        raise PipelineError(f"repeat ({repeat}) must be >= 1, warmup ({warmup}) >= 0 and "
                            f"min_s ({min_s}) >= 0")
    if any(t.is_cuda for t in _tensors(sample)):
        raise PipelineError("pass_cpu_s measures a pass's CPU seconds; give it a CPU sample "
                            "(a GPU's work is timed by measure_blocks)")
    probe = copy.deepcopy(blocks_of(model))
    for _ in range(warmup):
        _timed_pass(probe, sample, fresh=True)
    times: list[float] = []
    while len(times) < repeat or sum(times) < min_s:
        start = time.process_time()
        _timed_pass(probe, sample, fresh=True)
        times.append(time.process_time() - start)
    return _median(times)


def _timed_pass(seq: nn.Sequential, sample: Any, fresh: bool) -> tuple[list[float], list[float]]:
    """(forward seconds, backward seconds) of each block in one forward + backward of the
    whole `seq` on `sample` (which needs no gradient, like a first stage's data);
    `fresh`: start without gradients (else add into the last pass's)."""
    if fresh:
        seq.zero_grad(set_to_none=True)
    blocks = list(seq.children())
    n = len(blocks)
    marks = [time.perf_counter()]
    arrived: list[float | None] = [None] * n  # when block i's output gradient was complete
    x = _detach(sample)
    for i, block in enumerate(blocks):
        x = block(x)
        _sync(x)
        marks.append(time.perf_counter())
        if i < n - 1:
            _mark_gradient(x, arrived, i)
    outs = [t for t in _tensors(x) if t.requires_grad]
    start = time.perf_counter()
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    _sync(x)
    done = time.perf_counter()
    # block i's backward runs from its output's gradient (the pass's start for the last
    # block) to its input's (the pass's end for the first, and for any block no gradient
    # reaches: nothing before it needs one)
    known = [done if a is None else a for a in arrived[:-1]]
    begins, ends = [*known, start], [done, *known]
    return ([marks[i + 1] - marks[i] for i in range(n)],
            [max(0.0, ends[i] - begins[i]) for i in range(n)])


def _split_pass(seq: nn.Sequential, sample: Any) -> tuple[list[float], list[float]]:
    """(I seconds, W seconds) of each block in one forward and split backward of the whole
    `seq` (`split_backward.input_grad`, then each group of parameters' `W` alone, timed for
    the block of its first parameter), its input requiring a gradient as a later stage's
    does. Where the sample is not floating (token ids) block 0 can only open the first
    stage, whose backward is whole: the pass starts after it (`measure_blocks` gives it I 0
    and W its whole backward). The graph walk of `I` counts in the last block's I, where a
    stage pays it."""
    seq.zero_grad(set_to_none=True)
    blocks = list(seq.children())
    n, x = len(blocks), _leaf(sample)
    arrived: list[float | None] = [None] * n
    handles, owner = [], {id(p): i for i, b in enumerate(blocks) for p in b.parameters()}
    inputs = x if isinstance(x, torch.Tensor) and x.requires_grad else None
    for i, block in enumerate(blocks):
        x = block(x)
        if inputs is None and i < n - 1:  # the first input a gradient can reach
            x = inputs = _leaf(x)
        elif i < n - 1:
            handles += _mark_gradient(x, arrived, i)
    _sync(x)
    root = next((t for t in _tensors(x) if t.requires_grad), None)
    if root is None or inputs is None:
        return [0.0] * n, [0.0] * n
    start = time.perf_counter()
    _, later = input_grad(root, torch.ones_like(root), inputs, seq.parameters())
    _sync(root)
    done = time.perf_counter()
    for h in handles:
        h.remove()
    known = [done if a is None else a for a in arrived[:-1]]
    begins, ends = [*known, start], [done, *known]
    i_s = [max(0.0, ends[i] - begins[i]) for i in range(n)]
    w_s = [0.0] * n
    for group in later.groups:
        t0 = time.perf_counter()
        WeightGrad([group]).run()
        _sync(group.params[0])
        w_s[owner[id(group.params[0])]] += time.perf_counter() - t0
    if later.whole is not None:
        later.run()
    return i_s, w_s


def _mark_gradient(y: Any, arrived: list[float | None], i: int
                   ) -> list[torch.utils.hooks.RemovableHandle]:
    """Record in `arrived[i]` when the last gradient of `y`'s tensors is computed."""
    def hook(grad: torch.Tensor) -> None:
        _sync(grad)
        arrived[i] = time.perf_counter()

    return [t.register_hook(hook) for t in _tensors(y) if t.requires_grad]


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
