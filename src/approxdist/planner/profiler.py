"""Measure a model into a profile file (docs/planner.md, "The profile file"): the planner's profiler.

Builds the model and one micro-batch of real inputs from the run's config, sets torch's
thread count to the one the run will use, and measures every block with
`pipeline.profiler.measure_blocks` (forward and backward medians at that micro-batch
size, output, parameter and stashed bytes). Times are measured at the micro-batch size
asked for, never scaled from another one.
"""

from __future__ import annotations

import os
import platform
import time
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
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        param = nn.Parameter(torch.zeros(numel))
        param.grad = torch.full_like(param, 1e-3)
        opt = _OPTIMIZERS[name]([param])
        opt.step()  # creates the state
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return sorted(times)[len(times) // 2] / (4 * numel)


def machine(device: Any = "cpu") -> str:
    """Where a profile was measured: host, architecture, cores (and the GPU, if any)."""
    where = f"{platform.node() or 'unknown host'} ({platform.machine()}, {os.cpu_count()} cores)"
    if torch.device(device).type == "cuda":
        where += f", {torch.cuda.get_device_name(torch.device(device))}"
    return where
