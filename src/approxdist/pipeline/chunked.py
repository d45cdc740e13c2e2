"""One rank's part of a pipeline whose ranks hold several chunks (ZB-V: chunks r and 2P-1-r,
`topology.dealing.Dealing.v`): the model cut into the placement's chunks, a compute and a
transport per chunk on one link, one courier and one activation memory per rank."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import nn

from approxdist.comm.link import Link
from approxdist.config.pipeline import PipelineConfig
from approxdist.config.wire import Wire
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group
from approxdist.pipeline.couriers import make_courier
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.executor import PipelineExecutor
from approxdist.pipeline.handover import Handover
from approxdist.pipeline.partition import Partition, blocks_of, check_stage_count, stage_module
from approxdist.pipeline.runtime import PipelineRuntime, agree_partition, schedule_orders
from approxdist.pipeline.schedule.registry import placement_of
from approxdist.pipeline.schedule.zero_bubble import check_microbatches
from approxdist.pipeline.stage import LossFn, StageCompute, output_shape
from approxdist.pipeline.stage_memory import ActivationMemory
from approxdist.pipeline.step import Chunk
from approxdist.pipeline.transport import StageTransport
from approxdist.trace.recorder import Recorder


def build_chunked(pcfg: PipelineConfig, model: nn.Module, ctx: DistContext,
                  sample: torch.Tensor, group: Group, *, link_spec: str, seed: int,
                  loss_fn: LossFn, partition: Partition | None, rec: Recorder, fwd: Wire,
                  bwd: Wire) -> PipelineRuntime:
    """`build_runtime` for a schedule whose ranks hold several chunks (zbv): the model cut
    into the placement's chunks, this rank's chunks each with a compute and a transport on
    one link and one courier (messages between two ranks match in posting order whichever
    chunk they carry, `schedule.comm.sender_ordered`), one activation memory per rank."""
    dealing = placement_of(pcfg.schedule, pcfg.stages)
    chunks = len(dealing.replicas)
    if group.size != dealing.num_slots:
        raise PipelineError(f"{pcfg.schedule} on {pcfg.stages} stages needs {pcfg.stages} "
                            f"rank(s) but the pipeline's group is {group.describe()}")
    check_stage_count(chunks, len(blocks_of(model)))
    check_microbatches(pcfg.schedule, pcfg.stages, pcfg.microbatches)
    plan = partition or agree_partition(pcfg, model, sample, group, chunks)
    if rec.enabled:
        rec.meta["pipeline"] = {"stages": pcfg.stages, "chunks": chunks,
                                "microbatches": pcfg.microbatches, "schedule": pcfg.schedule,
                                "replicas": [1] * pcfg.stages}
    link = Link(ctx, link_spec or None, hook=rec.transfer_hook(), group=group)
    courier = make_courier(link, pcfg.comm_threads, rec)
    handover = Handover()
    mine = dealing.stages_of(group.rank)
    modules = [stage_module(model, plan, c) for c in mine]
    memory = ActivationMemory(modules[0])
    parts: dict[int, Chunk] = {}
    for chunk, module in zip(mine, modules):  # in chunk order: shapes flow down the V
        t = StageTransport(link, chunk, chunks, fwd, bwd, dealing, 0, seed=seed, rec=rec,
                           courier=courier, handover=handover)
        dtype = sample.dtype if t.is_first else torch.float32
        t.exchange_shapes(tuple(sample.shape[1:]), _infer(module, ctx.device, dtype))
        parts[chunk] = Chunk(StageCompute(module, is_first=t.is_first, is_last=t.is_last,
                                          loss_fn=loss_fn, recompute=pcfg.recompute,
                                          fuse_accumulation=pcfg.fuse_accumulation, split=True,
                                          memory=memory), t)
    loss_part = parts[max(mine)] if parts[max(mine)].transport.is_last else parts[min(mine)]
    first = parts[min(mine)]
    executor = PipelineExecutor(schedule_orders(pcfg.schedule, dealing, group.rank),
                                loss_part.compute, first.transport, pcfg.microbatches, rec,
                                chunks=parts)
    executor.dynamic_shapes = pcfg.dynamic_shapes
    # the rank's blocks under the model's names: its parameters and state, never called
    holder = nn.Sequential(OrderedDict(item for m in modules for item in m.named_children()))
    return PipelineRuntime(plan, holder, link, first.transport, loss_part.compute, executor)


def _infer(module: nn.Module, device: torch.device,
           dtype: torch.dtype) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
    return lambda shape: output_shape(module, shape, device, dtype)
