"""Assemble one rank's pipeline: partition, stage module, link, transport, executor (seed 000).

`check_run` holds the cross-checks a pipeline run needs before any worker starts (the
CLI's preflight calls it; workers call it again under torchrun). `build_runtime` does
the per-rank assembly: every rank builds the whole model from the same seed, keeps its
stage's blocks, agrees with the others on the partition, learns its boundary shapes, and
gets an executor for the named schedule. The pipeline runs on a `Group` whose member s
runs stage s: the whole world in rank order by default, or any ranks in any order (a
placement such as [2, 0, 3], the rest of the world free for other work). A recorder (docs/tracing.md) given to
`build_runtime` gets the link's transfers, the executor's phases and the pipeline's shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.comm.link import Link
from approxdist.config.pipeline import PipelineConfig
from approxdist.config.wire import EXACT, Wire
from approxdist.data_parallel.replicas import ReplicaReducer
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, world_group
from approxdist.pipeline.couriers import Plan, make_courier
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.executor import PipelineExecutor, forward_only
from approxdist.pipeline.microbatch import microbatch_sizes
from approxdist.pipeline.partition import (
    Partition,
    blocks_of,
    check_stage_count,
    parse_split,
    plan_partition,
    stage_module,
)
from approxdist.pipeline.profiler import profile_times
from approxdist.pipeline.schedule import Action, build_schedule
from approxdist.pipeline.schedule.action import is_split
from approxdist.pipeline.schedule.exchange import directions, exchange_order
from approxdist.pipeline.schedule.program import stream_program
from approxdist.pipeline.schedule.registry import (
    ASYNC_SCHEDULES,
    PLACEMENTS,
    build_async_schedule,
    num_chunks,
)
from approxdist.pipeline.schedule.replicated import (
    check_dealing,
    replicated_schedule,
    slot_route,
)
from approxdist.pipeline.schedule.zero_bubble import check_microbatches
from approxdist.pipeline.stage import LossFn, StageCompute, output_shape
from approxdist.pipeline.stream_state import StreamState
from approxdist.pipeline.transport import StageTransport
from approxdist.pipeline.weights import WeightVersions, available_bytes, check_version_memory
from approxdist.topology.dealing import Dealing, check_v
from approxdist.trace.recorder import NULL_RECORDER, Recorder


def check_run(pcfg: PipelineConfig, num_blocks: int, batch_size: int) -> None:
    """Stages vs blocks, split range, micro-batches vs batch; `PipelineError` naming them.

    Which ranks run the stages is the topology's business (`approxdist.topology`)."""
    chunks = num_chunks(pcfg.schedule, pcfg.stages)
    check_stage_count(chunks, num_blocks)
    dealing = Dealing(pcfg.replica_counts)
    check_dealing(dealing, pcfg.microbatches)
    check_microbatches(pcfg.schedule, pcfg.stages, pcfg.microbatches)
    check_chunked(pcfg)
    if pcfg.schedule in ASYNC_SCHEDULES:  # its micro-batch rules (2bw: M >= P - 1; rounds)
        build_async_schedule(pcfg.schedule, pcfg.stages, pcfg.microbatches,
                             dealing=dealing if max(dealing.replicas) > 1 else None)
    if pcfg.split:
        plan = parse_split(pcfg.split, num_blocks)
        if chunks != pcfg.stages and plan.num_stages % 2:
            check_v(tuple(range(plan.num_stages)), pcfg.schedule)  # two chunks per rank
        if plan.num_stages != chunks:
            what = f"{chunks} chunks ({pcfg.schedule} on {pcfg.stages} stages)" \
                if chunks != pcfg.stages else f"pipeline.stages is {pcfg.stages}"
            raise PipelineError(
                f"split {pcfg.split!r} makes {plan.num_stages} stages but {what}; give "
                f"{chunks - 1} boundaries in 1..{num_blocks - 1}")
    microbatch_sizes(batch_size, pcfg.microbatches)


def check_chunked(pcfg: PipelineConfig) -> None:
    """A schedule of several chunks per rank (zbv) runs one replica per stage and posts its
    messages inline or per-message (`PipelineError` naming the setting and the fix)."""
    if pcfg.schedule not in PLACEMENTS:
        return
    if max(pcfg.replica_counts, default=1) > 1:
        raise PipelineError(f"{pcfg.schedule} places two chunks per rank and runs no replicated "
                            f"stages (replicas {','.join(map(str, pcfg.replica_counts))}); use "
                            f"zbh1 or zbh2 with --replicas")
    if pcfg.comm_threads not in ("inline", "per-message", "sa"):
        raise PipelineError(f"{pcfg.schedule} shares one link between two chunks per rank: "
                            f"--comm-threads {pcfg.comm_threads} is not supported; use inline, "
                            f"per-message or sa")


def agree_partition(pcfg: PipelineConfig, model: nn.Module, sample: torch.Tensor,
                    group: Group, num_stages: int | None = None) -> Partition:
    """The partition of stage 0's rank (time profiles differ between ranks), sent to all;
    `num_stages` pieces (default `pcfg.stages`; a chunked schedule cuts more)."""
    plan: Partition | None = None
    if group.is_root:
        times = profile_times(model, sample) if pcfg.balance_method == "time" else None
        plan = plan_partition(model, num_stages=num_stages or pcfg.stages,
                              split=pcfg.split or None,
                              balance=pcfg.balance_method, block_times=times)
    plan = group.broadcast_object(plan)
    assert plan is not None
    return plan


@dataclass
class PipelineRuntime:
    """One rank's view of the pipeline; `close()` releases the link's shaper thread."""

    partition: Partition
    module: nn.Sequential
    link: Link
    transport: StageTransport
    compute: StageCompute
    executor: PipelineExecutor
    grad_sync: ReplicaReducer | None = None  # the replica all-reduce of a replicated stage

    @property
    def stage(self) -> int:
        return self.transport.stage

    def close(self) -> None:
        self.compute.close()
        self.transport.close()
        self.link.close()
        if self.grad_sync is not None:
            self.grad_sync.close()


def schedule_exchanges(name: str, dealing: Dealing, slot: int) -> Plan:
    """(M, training?) -> peer -> "send" / "recv" per message of a step: the agreed message
    order of the rank at `slot` with each neighbour (`--comm-threads sra`)."""
    def plan(num_microbatches: int, train: bool) -> dict[int, list[str]]:
        order = replicated_schedule(name, dealing, num_microbatches)
        if not train:
            order = {r: forward_only(actions) for r, actions in order.items()}
        pairs = exchange_order(order, slot_route(dealing), len(dealing.replicas))
        return directions(pairs, slot)

    return plan


def schedule_orders(name: str, dealing: Dealing, slot: int) -> Callable[[int], list[Action]]:
    """M -> the validated action list of the rank at `slot` (its stage's list, or with
    replicated stages its round-robin share of it closed by `AR`)."""
    if max(dealing.replicas) == 1:
        return lambda m: build_schedule(name, dealing.num_slots, m)[slot]
    return lambda m: replicated_schedule(name, dealing, m)[slot]


#: builds the gradient sync of a replicated stage around its module (every replica, in order)
SyncFactory = Callable[[nn.Module], ReplicaReducer]


def build_runtime(pcfg: PipelineConfig, model: nn.Module, ctx: DistContext,
                  sample: torch.Tensor, *, group: Group | None = None,
                  dealing: Dealing | None = None, grad_sync: SyncFactory | None = None,
                  link_spec: str = "", seed: int = 0, loss_fn: LossFn = F.cross_entropy,
                  partition: Partition | None = None, minibatches: int = 1,
                  rec: Recorder = NULL_RECORDER, fwd: Wire = EXACT,
                  bwd: Wire = EXACT) -> PipelineRuntime:
    """This rank's stage of `model` ready to run; `sample` is a batch of real inputs;
    activations travel on the `fwd` wire, their gradients on `bwd`.

    `group` holds the pipeline's ranks in stage-major order (default the world: member s
    runs stage s). With replicated stages (hybrid parallelism) `dealing` gives the
    replica counts, micro-batches go round robin to each stage's replicas, and
    `grad_sync(module)` builds the all-reduce of the stage's gradients over its replicas
    (`hybrid.build_hybrid_runtime`). Collective over the group (partition broadcast and
    the shape exchange); `rec` records the stage's phases and transfers. An asynchronous
    schedule (pipedream, 2bw) streams `minibatches` mini-batches with no flush between
    them (`pipeline.stream_state`; the trainer passes its steps per epoch); on replicated
    stages its `AR`s sum the step's gradients through the same `grad_sync(module)`.
    """
    group = group if group is not None else world_group(ctx)
    if pcfg.schedule in PLACEMENTS:
        check_chunked(pcfg)
        from approxdist.pipeline.chunked import build_chunked  # it builds on this module

        return build_chunked(pcfg, model, ctx, sample, group, link_spec=link_spec, seed=seed,
                             loss_fn=loss_fn, partition=partition, rec=rec, fwd=fwd, bwd=bwd)
    dealing = dealing if dealing is not None else Dealing.single(pcfg.stages)
    if len(dealing.replicas) != pcfg.stages or group.size != sum(dealing.replicas):
        raise PipelineError(f"pipeline.stages ({pcfg.stages}) with replicas "
                            f"{','.join(map(str, dealing.replicas))} need "
                            f"{sum(dealing.replicas)} rank(s) but the pipeline's group is "
                            f"{group.describe()}")
    check_stage_count(pcfg.stages, len(blocks_of(model)))
    check_microbatches(pcfg.schedule, pcfg.stages, pcfg.microbatches)
    plan = partition or agree_partition(pcfg, model, sample, group)
    stage, replica = dealing.place(group.rank)
    module = stage_module(model, plan, stage)
    if rec.enabled:  # lets `approxdist analyze` compute the bubble from the trace alone
        rec.meta["pipeline"] = {"stages": plan.num_stages, "microbatches": pcfg.microbatches,
                                "schedule": pcfg.schedule, "replicas": list(dealing.replicas)}
    link = Link(ctx, link_spec or None, hook=rec.transfer_hook(), group=group)
    transport = StageTransport(link, stage, plan.num_stages,
                               fwd, bwd, dealing, replica,
                               seed=seed, rec=rec,
                               courier=make_courier(
                                   link, pcfg.comm_threads, rec,
                                   schedule_exchanges(pcfg.schedule, dealing, group.rank)))
    # stage 0 sees the data's dtype (token ids are int64); later stages receive fp32
    dtype = sample.dtype if transport.is_first else torch.float32
    transport.exchange_shapes(tuple(sample.shape[1:]),
                              lambda shape: output_shape(module, shape, ctx.device, dtype))
    if pcfg.schedule in ASYNC_SCHEDULES and pcfg.dynamic_shapes:
        raise PipelineError(f"pipeline.schedule = {pcfg.schedule!r} streams mini-batches "
                            f"whose transfers are posted ahead across steps, so their "
                            f"shapes cannot change: dynamic_shapes needs a flushed "
                            f"schedule (1f1b, gpipe)")
    sync = grad_sync(module) if grad_sync is not None and dealing.replicas[stage] > 1 else None
    if pcfg.schedule in ASYNC_SCHEDULES:
        compute, executor = stream_executor(pcfg, minibatches, dealing, group.rank, module,
                                            transport, loss_fn, rec, sync)
        return PipelineRuntime(plan, module, link, transport, compute, executor, sync)
    orders = schedule_orders(pcfg.schedule, dealing, group.rank)
    compute = StageCompute(module, is_first=transport.is_first, is_last=transport.is_last,
                           loss_fn=loss_fn, recompute=pcfg.recompute,
                           fuse_accumulation=pcfg.fuse_accumulation,
                           split=is_split(orders(pcfg.microbatches)))
    executor = PipelineExecutor(orders, compute, transport, pcfg.microbatches, rec, sync)
    executor.dynamic_shapes = pcfg.dynamic_shapes
    return PipelineRuntime(plan, module, link, transport, compute, executor, sync)


def stream_executor(pcfg: PipelineConfig, minibatches: int, dealing: Dealing, slot: int,
                    module: nn.Module, transport: StageTransport, loss_fn: LossFn,
                    rec: Recorder, sync: ReplicaReducer | None = None
                    ) -> tuple[StageCompute, PipelineExecutor]:
    """The stage's compute on weight versions and the executor running the rank at `slot`'s
    program (`schedule.program`) of the asynchronous schedule `pcfg.schedule` over a stream
    of `minibatches` (the trainer's steps per epoch); `sync` sums a replicated stage's
    gradients at each `AR`. Evaluation runs GPipe's forward-only pipeline (dealt round
    robin when replicated)."""
    replicated = max(dealing.replicas) > 1
    schedule = build_async_schedule(pcfg.schedule, pcfg.stages, pcfg.microbatches, minibatches,
                                    dealing=dealing if replicated else None)
    stage = schedule.stage_of(slot)
    params = list(module.parameters())
    device = params[0].device if params else torch.device("cpu")
    check_version_memory(module, schedule.version_limit[slot], stage, pcfg.schedule,
                         available_bytes(device))
    weights = WeightVersions(module)
    # versions run through functional_call, so a fused Linear (accumulate.py) receives the
    # version's weight and accumulates into that version's .grad
    compute = StageCompute(module, is_first=transport.is_first, is_last=transport.is_last,
                           loss_fn=loss_fn, recompute=pcfg.recompute,
                           fuse_accumulation=pcfg.fuse_accumulation, call=weights)
    stream = StreamState(stream_program(schedule, slot), weights, compute, transport, sync)
    return compute, PipelineExecutor(schedule_orders("gpipe", dealing, slot), compute, transport,
                                     schedule.stream.microbatches, rec, stream=stream)

