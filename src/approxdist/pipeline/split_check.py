"""Before a run: can every stage of a split-backward schedule split its backward? (a dry I on
a copy of each block, `split_backward.input_grad`, on two rows of the sample).

A zero-bubble schedule (zbh1, zbh2, zbv) runs each stage's backward as I (the input
gradient) and W (the weight gradients later). A block whose backward writes a parameter's
`.grad` itself while computing its input gradient (a custom `autograd.Function` that
accumulates into `.grad`, a reentrant checkpoint) cannot be split; the executor would find
out at the first I, with every rank started. `check_splittable` finds it before: it runs
each block on a copy (its `.grad`, batch-norm statistics and the random generators stay as
they were) and refuses in one line naming the block, the parameter and the fixes.

Checking blocks one at a time is exact for the stages they make: a stage's I runs, inside
each of its blocks, the nodes from that block's output to its input, which are the ones
the block's own dry I runs. The first stage's inputs are data, so its backward is never
split: its blocks (block 0, or those before the first boundary of `split`) are not checked.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from approxdist.config.pipeline import PipelineConfig
from approxdist.pipeline.partition import blocks_of, parse_split
from approxdist.pipeline.schedule.action import is_split
from approxdist.pipeline.schedule.registry import SCHEDULES, build_schedule, num_chunks
from approxdist.pipeline.split_backward import SplitBackwardError, input_grad


def splits_backward(schedule: str) -> bool:
    """Whether the flushed schedule `schedule` has `I` / `W` actions (False for any other
    name: unknown names are refused where the schedule is built)."""
    if schedule not in SCHEDULES:
        return False
    order = build_schedule(schedule, 2, 8, validate=False)
    return any(is_split(actions) for actions in order.values())


def dry_input_grad(block: nn.Module, x: torch.Tensor, check: bool = True
                   ) -> tuple[list[str], object]:
    """`block` run on `x` as a copy (the block itself is left as it was: `.grad`, batch-norm
    statistics); with `check`, a dry I follows. Returns the names of the parameters whose
    `.grad` the input-gradient pass wrote (empty when it splits) and the block's output."""
    dry = copy.deepcopy(block)
    for p in dry.parameters():
        p.grad = None
    with torch.set_grad_enabled(check):
        x = x.detach().requires_grad_(check)
        out = dry(x)
    names: list[str] = []
    if check and isinstance(out, torch.Tensor) and out.grad_fn is not None:
        try:
            input_grad(out, torch.ones_like(out), x, dry.parameters())
        except SplitBackwardError:
            names = [n for n, p in dry.named_parameters() if p.grad is not None]
    return names, out.detach() if isinstance(out, torch.Tensor) else out


def check_splittable(pcfg: PipelineConfig, model: nn.Module, sample: torch.Tensor) -> None:
    """`SplitBackwardError` (one line: the block, the parameter and the fixes) when
    `pcfg.schedule` splits backwards and a block outside the first stage cannot; see the
    module doc. `sample` is a batch of real inputs."""
    schedule = pcfg.schedule
    if not splits_backward(schedule) or num_chunks(schedule, pcfg.stages) == 1:
        return  # whole backwards, or one stage, the first: nothing is split
    blocks = blocks_of(model)
    first = parse_split(pcfg.split, len(blocks)).ranges[0][1] if pcfg.split else 1
    # two rows (batch norm needs them); the random generators as they were after
    x: object = sample[:2] if sample.shape[0] > 1 else torch.cat([sample, sample])
    accelerator = sample.device.type != "cpu"
    with torch.random.fork_rng(devices=[sample.device] if accelerator else [],
                               device_type=sample.device.type if accelerator else None):
        for k, block in enumerate(blocks):
            if not isinstance(x, torch.Tensor):
                return  # the next block's input cannot be made here
            names, x = dry_input_grad(block, x, check=k >= first and x.is_floating_point())
            if names:
                raise SplitBackwardError(_refusal(schedule, k, block, names[0]))


def _refusal(schedule: str, k: int, block: nn.Module, name: str) -> str:
    return (f"schedule {schedule!r} splits each backward into I (input gradient) and W "
            f"(weight gradients), but block {k} ({type(block).__name__}) writes the gradient "
            f"of its parameter {k}.{name} while computing its input gradient (a custom "
            f"autograd.Function or reentrant checkpoint that accumulates into .grad); use "
            f"schedule 1f1b or gpipe (whole backwards), torch.utils.checkpoint("
            f"use_reentrant=False), or a split whose first stage holds block {k} (split "
            f"'{k + 1}' or later: the first stage's backward is not split)")
