"""Measure a model into a profile file (docs/planner.md, "The profile file"): the planner's profiler.

Builds the model and one micro-batch of real inputs from the run's config, sets torch's
thread count to the one the run will use, and measures every block with
`pipeline.profiler.measure_blocks` (forward and backward medians at that micro-batch
size, output, parameter and stashed bytes). Times are measured at the micro-batch size
asked for, never scaled from another one.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from approxdist.config.schema import DataConfig, ModelConfig, OptimConfig
from approxdist.data import load_dataset
from approxdist.errors import ConfigError
from approxdist.launch.malloc import hold_freed_memory
from approxdist.models import build_model
from approxdist.pipeline.profiler import REPEAT, measure_blocks
from approxdist.pipeline.stage import Criterion
from approxdist.planner.plan_file import planned_for
from approxdist.planner.profile import Profile


def profile_model(model: nn.Module, sample: torch.Tensor, name: str, threads: int | None = None,
                  repeat: int = REPEAT, warmup: int = 1, fuse_accumulation: str = "auto"
                  ) -> Profile:
    """The profile of `model` (an `nn.Sequential`) on the micro-batch `sample`, measured
    with `threads` torch threads (None: as set now); the thread count is restored after.
    `fuse_accumulation`: how the pipeline stages that run it accumulate (`acc_s`).
    Freed memory is held as the training ranks hold it (`hold_freed_memory`): without,
    each backward's fresh gradient of a large layer was mapped and faulted in afresh, and
    mlp-wide's 4 MB layers read 2.8-3.0 ms of backward where the ranks spend 1.4-1.6 (five
    profiles in a row in one process, 2026-11-27: the first one or two at 1.5, the rest
    at 2.9)."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ConfigError(f"threads = {threads!r} must be an integer >= 1")
    hold_freed_memory()
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        used = torch.get_num_threads()
        blocks = measure_blocks(model, sample, repeat=repeat, warmup=warmup,
                                fuse_accumulation=fuse_accumulation)
    finally:
        torch.set_num_threads(before)
    return Profile(model=name, input_shape=tuple(sample.shape[1:]),
                   micro_batch_size=int(sample.shape[0]),
                   threads=None if sample.is_cuda else used,
                   torch_version=torch.__version__, machine=machine(sample.device),
                   blocks=tuple(blocks))


def model_and_sample(model_cfg: ModelConfig, data_cfg: DataConfig, micro_batch_size: int,
                     device: str = "cpu") -> tuple[nn.Module, torch.Tensor]:
    """The model a run trains (seed 0) and the first `micro_batch_size` training samples
    of its data set: what a profile of the run measures."""
    data = load_dataset(data_cfg)
    n = data.train_x.shape[0]
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) \
            or not 1 <= micro_batch_size <= n:
        raise ConfigError(f"micro-batch size {micro_batch_size!r} must be 1..{n} (the "
                          f"{data.name} training set holds {n} samples)")
    torch.manual_seed(0)
    model = build_model(model_cfg, data.input_shape, data.num_classes).to(device)
    return model, data.train_x[:micro_batch_size].to(device)


def profile_run(model_cfg: ModelConfig, data_cfg: DataConfig, micro_batch_size: int,
                threads: int | None = None, repeat: int = REPEAT, device: str = "cpu",
                fuse_accumulation: str = "auto") -> Profile:
    """Build the model the run trains and profile it on the first `micro_batch_size`
    training samples of its data set (`fuse_accumulation`: its `pipeline` section's); the
    profile records the model's options and the data set (`plan --profile` plans them)."""
    model, sample = model_and_sample(model_cfg, data_cfg, micro_batch_size, device)
    return profile_built(model, sample, model_cfg, data_cfg, threads, repeat,
                         fuse_accumulation)


def profile_built(model: nn.Module, sample: torch.Tensor, model_cfg: ModelConfig,
                  data_cfg: DataConfig, threads: int | None = None, repeat: int = REPEAT,
                  fuse_accumulation: str = "auto") -> Profile:
    """`profile_run` of a model and sample already built by `model_and_sample`."""
    profile = profile_model(model, sample, model_cfg.name, threads, repeat,
                            fuse_accumulation=fuse_accumulation)
    planned = planned_for(model_cfg, data_cfg)
    return replace(profile, model_options=planned["model_options"], data=planned["data"])


#: the optimizers `train.optim` builds, as the cost model names them, with `[optim]`'s
#: default weight decay: its extra pass over the parameters is a third of a momentum step
#: (226 ps/B without it, 332 ps/B with it, one thread, 16 MB; 2026-11-27)
_DECAY = OptimConfig().weight_decay
_OPTIMIZERS = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.01, weight_decay=_DECAY),
               "momentum": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9,
                                                      weight_decay=_DECAY),
               "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=_DECAY)}


def optimizer_s_per_byte(name: str, threads: int | None = None, numel: int = 1 << 22,
                         repeat: int = 7) -> float:
    """Seconds of one step of optimizer `name` (sgd, momentum: SGD with momentum 0.9, adam)
    per byte of fp32 parameters: the median of `repeat` steps over `numel` values with
    `threads` torch threads (the thread count is restored after). Memory is held as the
    training ranks hold it (`hold_freed_memory`): without, glibc maps each step's 16 MB
    weight-decay temporary afresh until its dynamic threshold grows, and the first
    measurement in a process read 786 ps/B where the ranks pay about 340."""
    hold_freed_memory()
    if name not in _OPTIMIZERS:
        raise ConfigError(f"optimizer {name!r} is not one of {', '.join(_OPTIMIZERS)}")
    with _torch_threads(threads):
        step = _median_step(_OPTIMIZERS[name], [nn.Parameter(torch.zeros(numel))], repeat)
    return step / (4 * numel)


def optimizer_s_per_tensor(name: str, threads: int | None = None, few: int = 8,
                           many: int = 256, repeat: int = 31) -> float:
    """Seconds one step of optimizer `name` spends per parameter tensor beyond its bytes:
    the slope of the median step over `many` and over `few` tensors of 16 values each
    (their bytes cost nothing next to it). `torch.optim.SGD` on CPU loops over the tensors
    in Python, a few small operations each (weight decay, momentum, update), so a model of
    many small tensors pays per tensor what `optimizer_s_per_byte`, timed on one large
    tensor, does not see: about 10 us a tensor here, 0.6 ms a step for resnet20's 59
    tensors against 0.4 ms for its 1.1 MB (2026-11-28, docs/planner.md)."""
    if name not in _OPTIMIZERS:
        raise ConfigError(f"optimizer {name!r} is not one of {', '.join(_OPTIMIZERS)}")
    if not 1 <= few < many:
        raise ConfigError(f"tensor counts few = {few!r} and many = {many!r} must satisfy "
                          f"1 <= few < many, e.g. 8 and 256")
    hold_freed_memory()
    with _torch_threads(threads):
        steps = [_median_step(_OPTIMIZERS[name], [nn.Parameter(torch.zeros(16))
                                                  for _ in range(count)], repeat)
                 for count in (few, many)]
    return max(0.0, (steps[1] - steps[0]) / (many - few))


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """torch set to `threads` threads (None: as set now), restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _median_step(make: Any, params: list[nn.Parameter], repeat: int) -> float:
    """Median seconds of one step of the optimizer `make` builds over `params`."""
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    opt = make(params)
    opt.step()  # creates the state
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def loss_s_per_value(loss_fn: Criterion, threads: int | None = None, classes: int = 64,
                     rows: tuple[int, int] = (64, 2048), repeat: int = 31) -> float:
    """Seconds a step's loss adds per output value: `loss_fn`'s forward, its hit count and
    its backward on logits of (rows, `classes`), against the backward from a gradient of
    ones that a profile runs (`pipeline.profiler`), as the slope between the two row
    counts (the fixed part, tens of microseconds, is in the engines' per-action and
    per-step work). A profile times the model's blocks, not its loss; the last stage of a
    pipeline and every data-parallel replica compute the loss of each micro-batch over its
    whole output, a pass over (samples x classes) values, or (samples x tokens x
    vocabulary) for a language model: about 5 ns a value here, 0.7 ms per micro-batch of
    gpt-tiny's 8 x 64 x 256 logits (2026-11-28, docs/planner.md)."""
    if not 1 <= rows[0] < rows[1] or classes < 2:
        raise ConfigError(f"rows = {rows!r} must be two increasing counts >= 1 and classes = "
                          f"{classes!r} >= 2, e.g. (64, 2048) and 64")
    with _torch_threads(threads):
        extra = [_median_loss(loss_fn, n, classes, repeat) for n in rows]
    return max(0.0, (extra[1] - extra[0]) / ((rows[1] - rows[0]) * classes))


def _median_loss(loss_fn: Criterion, rows: int, classes: int, repeat: int) -> float:
    """Median seconds the loss and hits add to a backward on logits of (rows, classes)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, classes, generator=gen).requires_grad_(True)
    labels = torch.randint(classes, (rows,), generator=gen)
    total, hits = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.int64)

    def plain() -> None:
        out = logits * 1.0
        out.backward(torch.ones_like(out))

    def scored() -> None:
        nonlocal total, hits
        out = logits * 1.0
        loss = loss_fn(out, labels) * 0.5
        total = total + loss.detach().double()
        hits = hits + loss_fn.hits(out.detach(), labels)
        loss.backward()

    times: dict[str, list[float]] = {"plain": [], "scored": []}
    for _ in range(repeat + 1):
        for key, run in (("plain", plain), ("scored", scored)):
            t0 = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - t0)
    return statistics.median(times["scored"][1:]) - statistics.median(times["plain"][1:])


def machine(device: Any = "cpu") -> str:
    """Where a profile was measured: host, architecture, cores (and the GPU, if any)."""
    where = f"{platform.node() or 'unknown host'} ({platform.machine()}, {os.cpu_count()} cores)"
    if torch.device(device).type == "cuda":
        where += f", {torch.cuda.get_device_name(torch.device(device))}"
    return where
