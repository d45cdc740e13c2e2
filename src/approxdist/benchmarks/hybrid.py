"""Measures our hybrid runtime against the composition users build today (seed 002; torchtitan).

The baseline is torch.distributed.pipelining stages with DDP on the replica dimension:
each pipeline row a `PipelineStage` over the row's process group, each stage module
replicated over its replicas with `replicate` (DDP on the FSDP2 machinery, torchtitan's
choice; torch's stages skip its all-reduce for all but the last micro-batch's backward,
as ours do). The `DistributedDataParallel` module wrapper is not usable here: with
GPipe its reducer fails an internal assertion in torch 2.13 ("rebuilt parameter indices
size is not same as original model parameters size"). Same model, same
cut, same schedule, the same micro-batches per row and the same data (row j takes the
j-th share of the global batch; ours deals the same micro-batches round robin), on P x r
local gloo ranks started by `run_on_ranks`; timed rounds alternate which engine goes
first (`benchmarks.pipeline`). Ours also reports how much of its replica all-reduce
the last backward hid: 1 - (time blocked in `AR`) / (the all-reduce alone, timed on the
same gradients afterwards), the direct measure `bench dp` uses.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from approxdist.bench.stats import median
from approxdist.bench.timing import Timing, interleave, repeat, timed
from approxdist.benchmarks.pipeline import (
    BenchCase,
    Step,
    case_data,
    case_model,
    our_step,
    torch_schedule,
    torch_step,
)
from approxdist.config.dp import DPConfig
from approxdist.hybrid.runtime import build_hybrid_runtime
from approxdist.launch.affinity import bind_rank
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, new_group
from approxdist.pipeline.partition import Partition, stage_module
from approxdist.pipeline.runtime import PipelineRuntime
from approxdist.topology import Mesh
from approxdist.topology.groups import MeshGroups, make_groups
from approxdist.trace.times import StepTimes


def dp_config(case: BenchCase) -> DPConfig:
    """The replicas' reducer: DataParallel with the case's bucket sizes."""
    base = DPConfig()
    return dataclasses.replace(
        base, bucket_mb=base.bucket_mb if case.bucket_mb is None else case.bucket_mb,
        first_bucket_mb=base.first_bucket_mb if case.first_bucket_mb is None
        else case.first_bucket_mb)


def _torch(case: BenchCase, model: nn.Module, plan: Partition, groups: MeshGroups,
           row: Group, ctx: DistContext, x: torch.Tensor, y: torch.Tensor) -> Step:
    """One rank of torch.distributed.pipelining + DDP on the replicas; row j's share of x, y."""
    from torch.distributed import pipelining
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.device_mesh import DeviceMesh

    stage = groups.place.stage
    module = stage_module(model, plan, stage)
    mesh = DeviceMesh.from_group(groups.replicas.pg, ctx.device.type)
    replicate(module, mesh=mesh)  # in place: the module's class becomes a ReplicateModule
    pstage = pipelining.PipelineStage(module, stage, case.stages, ctx.device, group=row.pg)
    sched = torch_schedule(case, [pstage])
    share = slice(groups.place.replica * case.batch_size, (groups.place.replica + 1) * case.batch_size)
    return torch_step(sched, module, stage == 0, stage == case.stages - 1, x[share], y[share])


def _rows(mesh: Mesh, ctx: DistContext) -> Group:
    """Torch's pipeline rows (a collective over the world: every rank makes every row)."""
    rows = [new_group(ctx, ranks, f"row {j}") for j, ranks in enumerate(mesh.spans("pp"))]
    mine = next(g for g in rows if g is not None)
    return mine


def _hidden(rt: PipelineRuntime, x: torch.Tensor, y: torch.Tensor, blocked: float,
            steps: int) -> dict[str, float | None]:
    """Blocked time in `AR` per step vs the all-reduce alone on a step's gradients."""
    sync = rt.grad_sync
    if sync is None or steps == 0:
        return {"blocked_s": None, "comm_only_s": None}
    first, last = rt.transport.is_first, rt.transport.is_last
    rt.executor.train_step(x if first else None, y if last else None, x.shape[0])  # gradients
    alone = []
    for _ in range(max(3, min(steps, 10))):
        t0 = time.perf_counter()
        sync.reduce_gradients()
        sync.finish()
        alone.append(time.perf_counter() - t0)
    return {"blocked_s": blocked / steps, "comm_only_s": median(alone)}


def measure_case(ctx: DistContext, case: BenchCase, timing: Timing) -> dict[str, Any]:
    """Round times of both engines on this rank, our bubble and hidden all-reduce share."""
    mesh = Mesh.stages(case.stages, case.replicas)
    groups = make_groups(mesh, ctx, lanes={("dp",): 4})
    row = _rows(mesh, ctx)
    model = case_model(case)
    x, y = case_data(case)
    sample = x[: max(1, case.batch_size // case.microbatches)]
    rt = build_hybrid_runtime(case.pipeline_config(), dp_config(case), case.wire_config(),
                              copy.deepcopy(model), ctx, groups, sample, link=case.link,
                              loss_fn=case.inputs.loss)
    sink: list[StepTimes] = []
    engines = {"approxdist": our_step(rt, x, y, sink),
               "torch": _torch(case, copy.deepcopy(model), rt.partition, groups, row, ctx, x, y)}
    for step in engines.values():
        timed(repeat(step, timing.warmup), dist.barrier)
    sink.clear()  # forget the warm-up
    sync = rt.grad_sync
    blocked0 = sync.comm_seconds if sync is not None else 0.0
    rounds = interleave({name: repeat(step, timing.steps) for name, step in engines.items()},
                        timing.rounds, alternate=True, sync=dist.barrier)
    blocked = (sync.comm_seconds - blocked0) if sync is not None else 0.0
    hidden = _hidden(rt, x, y, blocked, len(sink))
    rt.close()
    total = StepTimes()
    for t in sink:
        total += t
    return {"rounds": rounds, "bubble": total.bubble, "stage": groups.place.stage, **hidden}


def measure_rank(ctx: DistContext, cases: list[BenchCase], timing: Timing) -> list[dict[str, Any]]:
    """Entry point for `run_on_ranks`: every case in order, on every rank (bound to cores
    once, by the first case's `bind_cores`: a run's cases share their grid)."""
    if cases:
        grid = Mesh.stages(cases[0].stages, cases[0].replicas)
        world = range(grid.world_size)  # the local launcher: one machine
        bind_rank(cases[0].bind_cores, ctx.rank, world, [grid.place(r).replica for r in world])
    return [measure_case(ctx, case, timing) for case in cases]
