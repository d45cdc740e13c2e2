"""Measures our pipeline runtime against `torch.distributed.pipelining` on the same ranks (seed 002).

`measure_rank` runs on every rank (through `launch.spawn.run_on_ranks`): for each case it
builds one model from a seed, cuts it with our partitioner, and gives one copy to our
executor and one to torch's `PipelineStage` with `ScheduleGPipe` / `Schedule1F1B` /
`ScheduleInterleavedZeroBubble` on one chunk per rank for ZB-H1 (same blocks, same
micro-batches, same data, gloo). Cases that differ only in their schedule
are measured together: every engine of every schedule takes its turn in each round
(interleaved, alternating order). Each round is `steps` mini-batches plus an optimiser
step each, between barriers; an asynchronous schedule (pipedream, 2bw; torch has none)
runs the round as one stream of `steps` mini-batches, its fill and drain included, and
steps its optimiser where the schedule says.
Our engine also reports its measured bubble: the share of each rank's step time spent
not computing, averaged over ranks, to compare with (P-1)/(M+P-1).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from approxdist.bench.timing import Timing, interleave, repeat, timed
from approxdist.config.pipeline import PipelineConfig
from approxdist.config.schema import ModelConfig
from approxdist.config.wire import Wire, WireConfig
from approxdist.launch.context import DistContext
from approxdist.models import build_model
from approxdist.models.bench_inputs import BenchInput
from approxdist.pipeline.partition import Partition, stage_module
from approxdist.pipeline.runtime import PipelineRuntime, build_runtime
from approxdist.pipeline.schedule import async_schedule_names
from approxdist.trace.times import StepTimes

#: our schedule -> torch's class running the same order (ZB-H1: torch's zero bubble on one
#: chunk per rank defers s weight gradients on stage s, as ours does)
TORCH_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
                   "zbh1": "ScheduleInterleavedZeroBubble"}
#: torch's schedules that take a list of stages (several chunks per rank)
TORCH_MULTI = {"ScheduleInterleavedZeroBubble"}


@dataclass(frozen=True)
class BenchCase:
    """One configuration: model, input, pipeline shape, wire formats and link."""

    model: str
    input_shape: tuple[int, ...]
    stages: int
    microbatches: int
    schedule: str
    batch_size: int = 64
    hidden: int = 1024
    depth: int = 7
    classes: int = 10
    split: str = ""
    balance: str = ""
    link: str = ""
    fwd_codec: str = "fp32"
    bwd_codec: str = "fp32"
    fuse_accumulation: str = "auto"
    replicas: int = 1  # hybrid: ranks per stage; `batch_size` and `microbatches` are per row
    tokens: bool = False  # a GPT model: token inputs, a next-token label per position
    #: hybrid: our replica all-reduce's buckets in MB (`[dp]`'s bucket_mb, first_bucket_mb;
    #: None: its defaults)
    bucket_mb: float | None = None
    first_bucket_mb: float | None = None
    #: hybrid: how the ranks' threads are bound to cores (`launch/affinity.py`)
    bind_cores: str = "none"

    @property
    def inputs(self) -> BenchInput:
        return BenchInput(self.input_shape, self.classes, self.tokens)

    def pipeline_config(self) -> PipelineConfig:
        """Ours: with replicas, the rows' micro-batches dealt round robin over one pipeline."""
        return PipelineConfig(stages=self.stages, split=self.split, balance=self.balance,
                              microbatches=self.microbatches * self.replicas,
                              schedule=self.schedule,
                              replicas=(self.replicas,) if self.replicas > 1 else (),
                              fuse_accumulation=self.fuse_accumulation)

    def wire_config(self) -> WireConfig:
        """Ours: activations and their gradients on the case's codecs."""
        return WireConfig(fwd=Wire(codec=self.fwd_codec), bwd=Wire(codec=self.bwd_codec))


def case_model(case: BenchCase) -> nn.Module:
    """The case's model, the same on every rank and for every engine (seed 0)."""
    torch.manual_seed(0)
    cfg = ModelConfig(name=case.model, hidden=case.hidden, depth=case.depth)
    return build_model(cfg, case.input_shape, case.classes)


def case_data(case: BenchCase) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole mini-batch of every pipeline row together (rows take contiguous shares)."""
    gen = torch.Generator().manual_seed(1)
    n = case.batch_size * case.replicas
    return case.inputs.sample(n, gen)


def our_step(rt: PipelineRuntime, x: torch.Tensor, y: torch.Tensor,
             sink: list[StepTimes]) -> Callable[[], None]:
    """One mini-batch of our runtime plus its optimiser step; each step's times go to `sink`."""
    opt = torch.optim.SGD(rt.module.parameters(), lr=1e-3)
    first, last = rt.transport.is_first, rt.transport.is_last
    stream = rt.executor.stream
    if stream is not None:
        stream.bind(opt)  # the asynchronous executor steps the optimiser itself

    def step() -> None:
        res = rt.executor.train_step(x if first else None, y if last else None, x.shape[0])
        if stream is None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        sink.append(res.times)

    return step


def _torch(case: BenchCase, model: nn.Module, plan: Partition, ctx: DistContext,
           x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    from torch.distributed import pipelining

    module = stage_module(model, plan, ctx.rank)
    stage = pipelining.PipelineStage(module, ctx.rank, case.stages, ctx.device)
    return torch_step(torch_schedule(case, stage), module, ctx.rank, case.stages, x, y)


def torch_schedule(case: BenchCase, stage: Any) -> Any:
    """torch's schedule for `case.schedule` over one `PipelineStage` of this rank."""
    from torch.distributed import pipelining

    name = TORCH_SCHEDULES[case.schedule]
    return getattr(pipelining, name)([stage] if name in TORCH_MULTI else stage,
                                     case.microbatches, loss_fn=case.inputs.loss)


def torch_step(sched: Any, module: nn.Module, stage: int, stages: int, x: torch.Tensor,
               y: torch.Tensor) -> Callable[[], None]:
    """One mini-batch of a torch.distributed.pipelining schedule plus an SGD step."""
    opt = torch.optim.SGD(module.parameters(), lr=1e-3)

    def step() -> None:
        if stage == 0:
            sched.step(x, return_outputs=False)
        elif stage == stages - 1:
            sched.step(target=y, losses=[], return_outputs=False)
        else:
            sched.step(return_outputs=False)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _engines(ctx: DistContext, case: BenchCase, timing: Timing, model: nn.Module,
             sink: list[StepTimes]) -> tuple[PipelineRuntime, dict[str, Callable[[], None]]]:
    """Our runtime and the steps of both engines for `case` (torch's where it has the
    schedule); an asynchronous schedule streams `timing.steps` mini-batches per round."""
    x, y = case_data(case)
    wire = case.wire_config()
    rt = build_runtime(case.pipeline_config(), copy.deepcopy(model), ctx,
                       x[: max(1, case.batch_size // case.microbatches)], link_spec=case.link,
                       minibatches=timing.steps, loss_fn=case.inputs.loss, fwd=wire.fwd,
                       bwd=wire.bwd)
    engines = {"approxdist": our_step(rt, x, y, sink)}
    if case.schedule in TORCH_SCHEDULES:
        engines["torch"] = _torch(case, copy.deepcopy(model), rt.partition, ctx, x, y)
    return rt, engines


def measure_group(ctx: DistContext, cases: list[BenchCase], timing: Timing) -> list[dict[str, Any]]:
    """Every case's engines interleaved in the same rounds (cases that differ only in their
    schedule): round times per engine and our measured bubble, per case."""
    model = case_model(cases[0])
    sinks: list[list[StepTimes]] = [[] for _ in cases]
    runtimes, steps = [], {}
    for i, case in enumerate(cases):
        rt, engines = _engines(ctx, case, timing, model, sinks[i])
        runtimes.append(rt)
        steps.update({f"{i}:{name}": step for name, step in engines.items()})
    for key, step in steps.items():  # warm-up; an asynchronous schedule: a whole stream
        streams = cases[int(key.split(":")[0])].schedule in async_schedule_names()
        timed(repeat(step, timing.steps if streams else timing.warmup), dist.barrier)
    for sink in sinks:
        sink.clear()
    rounds = interleave({key: repeat(step, timing.steps) for key, step in steps.items()},
                        timing.rounds, alternate=True, sync=dist.barrier)
    for rt in runtimes:
        rt.close()
    out = []
    for i, sink in enumerate(sinks):
        total = StepTimes()
        for t in sink:
            total += t
        mine = f"{i}:"
        out.append({"rounds": {key[len(mine):]: ts for key, ts in rounds.items()
                               if key.startswith(mine)},
                    "bubble": total.bubble})
    return out


def measure_case(ctx: DistContext, case: BenchCase, timing: Timing) -> dict[str, Any]:
    """Round times of both engines on this rank, and our compute/wall split."""
    return measure_group(ctx, [case], timing)[0]


def measure_rank(ctx: DistContext, cases: list[BenchCase], timing: Timing) -> list[dict[str, Any]]:
    """Entry point for `run_on_ranks`: the cases grouped by everything but the schedule, each
    group's engines interleaved, results in the order of `cases`."""
    groups: dict[BenchCase, list[int]] = {}
    for i, case in enumerate(cases):
        groups.setdefault(replace(case, schedule=""), []).append(i)
    results: dict[int, dict[str, Any]] = {}
    for members in groups.values():
        for i, res in zip(members, measure_group(ctx, [cases[i] for i in members], timing)):
            results[i] = res
    return [results[i] for i in range(len(cases))]
