"""Measures our pipeline runtime against `torch.distributed.pipelining` on the same ranks (seed 002).

`measure_rank` runs on every rank (through `launch.spawn.run_on_ranks`): for each case it
builds one model from a seed, cuts it with our partitioner, and gives one copy to our
executor and one to torch's `PipelineStage` with `ScheduleGPipe` / `Schedule1F1B` /
`ScheduleInterleavedZeroBubble` on one chunk per rank for ZB-H1 / `ScheduleZBVZeroBubble`
on the two chunks of ZB-V's V (same blocks, same micro-batches, same data, gloo). Every
engine's warm-up losses are kept: torch's must equal ours (`loss_mismatch`), else the two
train different things and their times do not compare. Cases that differ only in their schedule
are measured together: every engine of every schedule takes its turn in each round
(interleaved, alternating order). Each round is `steps` mini-batches plus an optimiser
step each, between barriers; an asynchronous schedule (pipedream, 2bw; torch has none)
runs the round as one stream of `steps` mini-batches, its fill and drain included, and
steps its optimiser where the schedule says.
Our engine also reports its measured bubble: the share of each rank's step time spent
not computing, averaged over ranks, to compare with (P-1)/(M+P-1); and the bytes of
weights its asynchronous streams copied in the timed rounds (`pipeline.weights`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from approxdist.bench.baseline import LOSS_RTOL, beyond_rounding
from approxdist.bench.timing import Timing, interleave, repeat
from approxdist.config.pipeline import PipelineConfig
from approxdist.config.schema import ModelConfig
from approxdist.config.wire import Wire, WireConfig
from approxdist.launch.context import DistContext
from approxdist.models import build_model
from approxdist.models.bench_inputs import BenchInput
from approxdist.pipeline.partition import Partition, stage_module
from approxdist.pipeline.runtime import PipelineRuntime, build_runtime
from approxdist.pipeline.schedule import async_schedule_names
from approxdist.pipeline.schedule.registry import placement_of
from approxdist.trace.times import StepTimes

#: our schedule -> torch's class running the same order (ZB-H1: torch's zero bubble on one
#: chunk per rank defers s weight gradients on stage s, as ours does)
TORCH_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
                   "zbh1": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble"}
#: torch's schedules that take a list of stages (several chunks per rank)
TORCH_MULTI = {"ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble"}
#: one step of an engine on every rank; its loss on the rank holding the last stage, else None
Step = Callable[[], float | None]


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
             sink: list[StepTimes]) -> Step:
    """One mini-batch of our runtime plus its optimiser step; each step's times go to `sink`."""
    opt = torch.optim.SGD(rt.module.parameters(), lr=1e-3)
    first, last = rt.executor.is_first, rt.executor.is_last  # zbv: rank 0 is both
    stream = rt.executor.stream
    if stream is not None:
        stream.bind(opt)  # the asynchronous executor steps the optimiser itself

    def step() -> float | None:
        res = rt.executor.train_step(x if first else None, y if last else None, x.shape[0])
        if stream is None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        sink.append(res.times)
        return res.loss if last else None

    return step


def _torch(case: BenchCase, model: nn.Module, plan: Partition, ctx: DistContext,
           x: torch.Tensor, y: torch.Tensor) -> Step:
    """This rank's `PipelineStage`s (ZB-V: the two chunks of its V) under torch's schedule."""
    from torch.distributed import pipelining

    mine = placement_of(case.schedule, case.stages).stages_of(ctx.rank)
    modules = [stage_module(model, plan, c) for c in mine]
    stages = [pipelining.PipelineStage(m, c, plan.num_stages, ctx.device)
              for c, m in zip(mine, modules)]
    return torch_step(torch_schedule(case, stages), nn.ModuleList(modules), 0 in mine,
                      plan.num_stages - 1 in mine, x, y)


def torch_schedule(case: BenchCase, stages: list[Any]) -> Any:
    """torch's schedule for `case.schedule` over this rank's `PipelineStage`s (one, or ZB-V's
    two)."""
    from torch.distributed import pipelining

    name = TORCH_SCHEDULES[case.schedule]
    if name not in TORCH_MULTI and len(stages) != 1:
        raise ValueError(f"torch's {name} takes one stage per rank, got {len(stages)}; "
                         f"use a schedule of {sorted(TORCH_MULTI)}")
    return getattr(pipelining, name)(stages if name in TORCH_MULTI else stages[0],
                                     case.microbatches, loss_fn=case.inputs.loss)


def torch_step(sched: Any, module: nn.Module, first: bool, last: bool, x: torch.Tensor,
               y: torch.Tensor) -> Step:
    """One mini-batch of a torch.distributed.pipelining schedule plus an SGD step; `first`
    and `last`: this rank holds the first / last stage (ZB-V's rank 0 both)."""
    opt = torch.optim.SGD(module.parameters(), lr=1e-3)

    def step() -> float | None:
        losses: list[torch.Tensor] = []
        args = (x,) if first else ()
        if last:
            sched.step(*args, target=y, losses=losses, return_outputs=False)
        else:
            sched.step(*args, return_outputs=False)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(torch.stack(losses).detach().mean()) if last else None

    return step


def _engines(ctx: DistContext, case: BenchCase, timing: Timing, model: nn.Module,
             sink: list[StepTimes]) -> tuple[PipelineRuntime, dict[str, Step]]:
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
    schedule): round times and warm-up losses per engine and our measured bubble, per case."""
    model = case_model(cases[0])
    sinks: list[list[StepTimes]] = [[] for _ in cases]
    runtimes: list[PipelineRuntime] = []
    steps: dict[str, Step] = {}
    for i, case in enumerate(cases):
        rt, engines = _engines(ctx, case, timing, model, sinks[i])
        runtimes.append(rt)
        steps.update({f"{i}:{name}": step for name, step in engines.items()})
    losses: dict[str, list[float | None]] = {}
    for key, step in steps.items():  # warm-up; an asynchronous schedule: a whole stream
        streams = cases[int(key.split(":")[0])].schedule in async_schedule_names()
        dist.barrier()
        losses[key] = [step() for _ in range(timing.steps if streams else timing.warmup)]
        dist.barrier()
    for sink in sinks:
        sink.clear()
    copied = [_copied(rt) for rt in runtimes]
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
                    "losses": {key[len(mine):]: ls for key, ls in losses.items()
                               if key.startswith(mine)},
                    "bubble": total.bubble,
                    "weight_copy_bytes": _copied(runtimes[i]) - copied[i]})
    return out


def _copied(rt: PipelineRuntime) -> int:
    """Bytes of weights an asynchronous stream's versions copied so far (0: none, or flushed)."""
    stream = rt.executor.stream
    return stream.weights.copied_bytes if stream is not None else 0


def last_losses(results: list[dict[str, Any]], engine: str) -> list[float] | None:
    """`engine`'s warm-up losses from the rank that holds the last stage (every rank's result)."""
    for res in results:
        ls = res.get("losses", {}).get(engine)
        if ls and ls[0] is not None:
            return list(ls)
    return None


def loss_mismatch(case: BenchCase, results: list[dict[str, Any]]) -> str | None:
    """Why torch's times do not compare with ours on `case`: a warm-up loss differs beyond
    fp32 rounding (`LOSS_RTOL`); None: they agree, or torch has no such schedule."""
    ours, theirs = last_losses(results, "approxdist"), last_losses(results, "torch")
    for i, (a, b) in enumerate(zip(ours or [], theirs or [])):
        if beyond_rounding(a, b):
            return (f"bench pipeline: {case.schedule} at {case.microbatches} micro-batches: "
                    f"warm-up step {i + 1}'s loss differs, torch {b:.7g}, approxdist {a:.7g} "
                    f"(beyond fp32 rounding, {LOSS_RTOL:g} relative), so the two do not train "
                    f"the same model and their times would not compare; torch's stages must "
                    f"hold the same chunks as ours and scale gradients as ours does")
    return None


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
