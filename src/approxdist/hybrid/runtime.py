"""One rank of a hybrid run: a pipeline stage whose replicas sum their gradients (seed 002).

Every replica of stage s runs the micro-batches m with m mod r_s = its index; each
micro-batch's loss is weighted by its share of the whole mini-batch, so the *sum* of the
replicas' gradients is the mini-batch's gradient: single-process training on the same
batch, whatever the replication. The sum runs through `DataParallel` on the replica
group (any algorithm, codec, error feedback, emulated link, byte count and trace of the
data-parallel engine): its gradient hooks are off for the earlier micro-batches (they
only accumulate) and launch buckets during the last one's backward, which continues
meanwhile; the schedule's `AR` action waits for them before the optimiser step, so the
stage sends its last input gradient upstream without waiting for the all-reduce.

An asynchronous schedule (pipedream, 2bw; `pipeline.stream_state`) streams `minibatches`
mini-batches: each replica steps in lockstep with the others of its stage, once per round
of its replicas (2bw: once per mini-batch), and the schedule's `AR` sums the step's
gradient through the same `DataParallel` (`reduce_gradients`) before the optimiser step.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.config.dp import DPConfig
from approxdist.config.pipeline import PipelineConfig
from approxdist.config.wire import WireConfig
from approxdist.data_parallel.replicas import ReplicaReducer, build_reducer
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group
from approxdist.pipeline.executor import StepResult
from approxdist.pipeline.runtime import PipelineRuntime, build_runtime
from approxdist.pipeline.stage import LossFn
from approxdist.topology.dealing import Dealing
from approxdist.topology.groups import MeshGroups
from approxdist.trace.recorder import NULL_RECORDER, Recorder


def build_hybrid_runtime(pcfg: PipelineConfig, dp: DPConfig, wire: WireConfig,
                         model: nn.Module, ctx: DistContext, groups: MeshGroups,
                         sample: torch.Tensor, *,
                         link: str = "", seed: int = 0, rec: Recorder = NULL_RECORDER,
                         loss_fn: LossFn = F.cross_entropy,
                         minibatches: int = 1) -> PipelineRuntime:
    """This rank's replicated stage of `model` (collective over the pipeline group): the
    stage's gradients summed over `groups.replicas` by `dp`'s reducer on the `grad` wire,
    activations on `fwd` and their gradients on `bwd`; `minibatches`: the stream of an
    asynchronous schedule (the trainer's steps per epoch)."""

    def reducer(module: nn.Module) -> ReplicaReducer:
        return build_reducer(dp, module, groups.replicas, wire=wire.grad, ctx=ctx, link=link,
                             rec=rec, op="sum", wait_in_backward=False, seed=seed)

    assert groups.pipeline is not None
    return build_runtime(pcfg, model, ctx, sample, group=groups.pipeline,
                         dealing=Dealing.of(groups.mesh), grad_sync=reducer,
                         link_spec=link, seed=seed, rec=rec, loss_fn=loss_fn,
                         minibatches=minibatches, fwd=wire.fwd, bwd=wire.bwd)


def mean_loss(res: StepResult, replicas: Group | None, *, streamed: bool) -> float | None:
    """The mean loss of a step on the last stage, over its replicas when it has several: a
    flushed step weighs each replica's micro-batches by their share (the sum is the mean);
    a stream's is the loss summed over the samples every replica finished, divided by
    their number (None: none finished)."""
    if replicas is not None and replicas.size < 2:
        replicas = None
    if streamed:
        loss, samples = res.loss, float(res.samples)
        if replicas is not None:
            both = replicas.all_reduce(torch.tensor([loss, samples], dtype=torch.float64))
            loss, samples = float(both[0]), float(both[1])
        return loss / samples if samples else None
    if replicas is not None:
        total = replicas.all_reduce(torch.tensor([float(res.loss or 0.0)], dtype=torch.float64))
        return float(total.item())
    return res.loss
