"""One pipeline stage's compute alone, in one process: whole backwards against a split
backward (I, W), fused and unfused (`approxdist bench stage`).

A middle stage (it receives an output gradient and returns an input gradient) of `layers`
`nn.Linear(width, width)` + ReLU blocks runs one step of M micro-batches of `rows` rows in
its schedule's order, with no process and no transfer: `1f1b` runs F and B, `zbh1` F, I and
W in ZB-H1's order for stage `stage` of `stages` (its deferred Ws back to back at the end,
where the fused layers' GEMMs run as one). Each variant runs with `--fuse-accumulation all`
(`fused`) and `off` (`unfused`); rounds interleave every variant and alternate their
order; the baseline is `1f1b fused`, the paired ratio per round is reported (ZB-H1 loses
nothing in compute when `zbh1 fused` is at 1.0x).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from approxdist.bench.stats import median, paired_ratio
from approxdist.bench.timing import interleave
from approxdist.pipeline.schedule import Kind, build_schedule
from approxdist.pipeline.stage import StageCompute

#: (schedule, fuse_accumulation) of every variant; the first is the baseline
VARIANTS = (("1f1b", "all"), ("1f1b", "off"), ("zbh1", "all"), ("zbh1", "off"))


@dataclass(frozen=True)
class StageCase:
    """The stage measured: its blocks, the micro-batches and where it sits (each field's
    `help` is its `bench stage` flag's)."""

    width: int = field(default=1024, metadata={"help": "features of every linear layer"})
    layers: int = field(default=4, metadata={"help": "linear + ReLU blocks in the stage"})
    rows: int = field(default=8, metadata={"help": "rows per micro-batch"})
    microbatches: int = field(default=4, metadata={"help": "micro-batches per step"})
    stages: int = field(default=2, metadata={"help": "pipeline stages (the order's shape)"})
    stage: int = field(default=1, metadata={"help": "whose schedule order the stage runs"})


@dataclass(frozen=True)
class StageRow:
    """One variant's median seconds per step and its paired ratio to the baseline."""

    schedule: str
    fusion: str
    step_s: float
    vs_base: float


def step_op(case: StageCase, schedule: str, fuse: str) -> Callable[[], None]:
    """One step of the stage's compute actions in `schedule`'s order (fresh gradients)."""
    torch.manual_seed(0)
    blocks = [m for _ in range(case.layers) for m in (nn.Linear(case.width, case.width), nn.ReLU())]
    module = nn.Sequential(*blocks)
    order = [a for a in build_schedule(schedule, case.stages, case.microbatches)[case.stage]
             if a.is_compute]
    compute = StageCompute(module, is_first=False, is_last=False, loss_fn=nn.functional.mse_loss,
                           fuse_accumulation=fuse, split=schedule != "1f1b")
    xs = [torch.randn(case.rows, case.width) for _ in range(case.microbatches)]
    gs = [torch.randn(case.rows, case.width) for _ in range(case.microbatches)]

    def step() -> None:
        module.zero_grad(set_to_none=True)
        for i, a in enumerate(order):
            m = a.microbatch
            if a.kind is Kind.FORWARD:
                compute.forward(m, xs[m].clone(), None, 1.0)
            elif a.kind is Kind.BACKWARD:
                compute.backward(m, gs[m])
            elif a.kind is Kind.BACKWARD_INPUT:
                compute.backward_input(m, gs[m])
            else:
                nxt = next((b for b in order[i + 1:]), None)
                compute.backward_weight(m, flush=nxt is None or nxt.kind is not Kind.BACKWARD_WEIGHT)

    return step


def measure(case: StageCase, rounds: int, steps: int, warmup: int = 3) -> list[StageRow]:
    """Every variant's step, interleaved over `rounds` rounds of `steps` steps each."""
    ops = {f"{s} {f}": step_op(case, s, f) for s, f in VARIANTS}
    times = interleave(ops, rounds, per_round=steps, warmup=warmup, alternate=True)
    base = times[next(iter(ops))]
    return [StageRow(s, f, median(times[f"{s} {f}"]), paired_ratio(times[f"{s} {f}"], base))
            for s, f in VARIANTS]
