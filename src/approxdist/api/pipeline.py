"""`approxdist.Pipeline`: pipeline parallelism for a user's own model, data, loss and loop.

In the spirit of `approxdist.DataParallel` and of torch.distributed.pipelining's stage +
schedule: every rank builds the same `nn.Sequential` (or list of blocks) from the same
seed and wraps it; each rank keeps its stage's blocks and runs them on the pipeline
engine (`pipeline.runtime`: partition, transport through the link layer, executor), so
every schedule, wire format per direction, channel, emulated link, recomputation and
tracing apply. The user's loop calls `step` once per mini-batch:

    dist.init_process_group("gloo")
    pipe = approxdist.Pipeline(model, sample=x0, schedule="1f1b", microbatches=4,
                               fwd_codec="bf16", loss_fn=F.cross_entropy)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.05)
    for x, y in batches:                 # every rank walks the same mini-batches
        loss = pipe.step(x, y)           # the mean loss on the last stage, None elsewhere
        opt.step(); opt.zero_grad()

Stage 0 reads the inputs, the last stage the targets (the others may pass None). The
loss of a micro-batch is `loss_fn(output, targets)`, any differentiable scalar. An
asynchronous schedule (pipedream, pipedream-vsync, 2bw) steps the optimiser itself where
the schedule updates: give `optimizer=` (a function of the stage's parameters) and the
stream's length `stream=K` (mini-batches between two flushes); `step` then returns the
loss of the micro-batches the last stage finished during the call. With
`dynamic_shapes=True` the per-sample shapes may change from one mini-batch to the next
(sequence lengths, say): the stages agree on each mini-batch's shapes before its
transfers (one small message per boundary); off (the default) costs nothing and a
changed shape is refused with a message saying so.

Hybrid (seed 002's replicated stages): `replicas=(2, 1)` puts stage 0 on two ranks and
stage 1 on one (one count for every stage, or one per stage, adding up to the world;
ranks are placed stage-major). Every rank still passes the whole mini-batch; the
micro-batches are dealt round robin to a stage's replicas (PipeDream's 1F1B-RR with a
flush), and the replicas sum their gradients through `DataParallel` on their group
(`grad_codec`, `algorithm`, `calibration`, the link), so after `step` every replica holds
the mini-batch's gradient of its stage: single-process training on the same batch. A
replicated last stage returns the mini-batch's mean loss on each of its replicas.
pipedream and 2bw run on replicated stages too (micro-batches a multiple of every replica
count; the replicas of a stage step in lockstep on their summed gradient, docs/pipeline.md);
pipedream-vsync does not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.config.loader import build_config
from approxdist.config.pipeline import PipelineConfig
from approxdist.data_parallel.checks import context_of
from approxdist.errors import ConfigError
from approxdist.hybrid import build_hybrid_runtime
from approxdist.launch.group import Group
from approxdist.pipeline.errors import ScheduleError
from approxdist.pipeline.runtime import PipelineRuntime, build_runtime
from approxdist.pipeline.schedule import async_schedule_names, schedule_names
from approxdist.pipeline.schedule.registry import build_async_schedule
from approxdist.pipeline.stage import LossFn
from approxdist.pipeline.stream import StreamExecutor
from approxdist.topology import Mesh
from approxdist.topology.dealing import Dealing
from approxdist.topology.groups import make_groups

OptimizerFactory = Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer]


class Pipeline:
    """This rank's stage of `model`, run by the pipeline engine one mini-batch per `step`."""

    def __init__(self, model: nn.Sequential | Sequence[nn.Module], *, sample: torch.Tensor,
                 stages: int | None = None, split: str | Sequence[int] = "",
                 balance: str = "", schedule: str = "1f1b", microbatches: int = 4,
                 fwd_codec: str = "fp32", bwd_codec: str = "fp32", fwd_channel: str = "none",
                 bwd_channel: str = "none", link: str = "", recompute: bool = False,
                 loss_fn: LossFn = F.cross_entropy, group: Group | None = None,
                 optimizer: OptimizerFactory | None = None, stream: int = 0,
                 dynamic_shapes: bool = False, seed: int = 0,
                 replicas: int | Sequence[int] = 1, grad_codec: str = "fp32",
                 algorithm: str = "hybrid", calibration: str = "") -> None:
        blocks = model if isinstance(model, nn.Sequential) else nn.Sequential(*model)
        ctx = context_of(blocks)
        if not ctx.distributed:
            raise ConfigError("approxdist.Pipeline needs torch.distributed: call "
                              "dist.init_process_group(...) on every rank first (e.g. under "
                              "torchrun), one rank per stage")
        names = schedule_names() + async_schedule_names()
        if schedule not in names:
            raise ConfigError(f"schedule {schedule!r} is not one of: {', '.join(names)}")
        asynchronous = schedule in async_schedule_names()
        if asynchronous and (optimizer is None or stream < 1):
            raise ConfigError(f"schedule {schedule!r} is asynchronous: it steps the optimiser "
                              f"inside the stream; pass optimizer=lambda params: "
                              f"torch.optim.SGD(params, lr=...) and stream=K (mini-batches "
                              f"between two flushes, e.g. the steps of an epoch)")
        if not asynchronous and (optimizer is not None or stream):
            raise ConfigError(f"schedule {schedule!r} flushes after every mini-batch: step "
                              f"your own optimiser over pipe.parameters(); optimizer= and "
                              f"stream= are for asynchronous schedules")
        cut = split if isinstance(split, str) else ",".join(str(int(b)) for b in split)
        counts = _replicas(replicas, stages, ctx.world_size)
        pcfg = PipelineConfig(stages=stages or (len(counts) if counts else group.size if group
                                                else ctx.world_size),
                              split=cut, balance=balance, microbatches=microbatches,
                              schedule=schedule, fwd_codec=fwd_codec, bwd_codec=bwd_codec,
                              fwd_channel=fwd_channel, bwd_channel=bwd_channel,
                              recompute=recompute, dynamic_shapes=dynamic_shapes,
                              replicas=counts)
        #: the stage's replica group (hybrid), for the loss of a replicated last stage
        self.replica_group: Group | None = None
        if counts and asynchronous:  # its rules on replicas, as one line (docs/pipeline.md)
            try:
                build_async_schedule(schedule, len(counts), microbatches, 1,
                                     dealing=Dealing(counts))
            except ScheduleError as exc:
                raise ConfigError(f"schedule {schedule!r} on replicas={list(counts)}: "
                                  f"{exc}") from None
        if counts:
            if group is not None:
                raise ConfigError("replicas= places the stages on the whole world; drop "
                                  "group= (or run a pipeline of one rank per stage on it)")
            cfg = dataclasses.replace(build_config({
                "train": {"parallel": "hybrid", "world_size": sum(counts), "seed": seed},
                "dp": {"codec": grad_codec, "algorithm": algorithm, "calibration": calibration},
                "comm": {"link": link}}), pipeline=pcfg)
            groups = make_groups(Mesh.stages(pcfg.stages, counts), ctx,
                                 streams={("dp",): cfg.dp.threads + 2})
            self.runtime: PipelineRuntime = build_hybrid_runtime(
                cfg, blocks, ctx, groups, sample, loss_fn=loss_fn, minibatches=max(stream, 1))
            self.replica_group = groups.replicas
        else:
            self.runtime = build_runtime(
                pcfg, blocks, ctx, sample, group=group, link_spec=link, seed=seed,
                loss_fn=loss_fn, minibatches=max(stream, 1))
        self.module: nn.Sequential = self.runtime.module
        self.optimizer: torch.optim.Optimizer | None = None
        executor = self.runtime.executor
        if isinstance(executor, StreamExecutor):
            assert optimizer is not None
            self.optimizer = optimizer(self.module.parameters())
            executor.bind(self.optimizer)

    @property
    def stage(self) -> int:
        return self.runtime.stage

    @property
    def is_first(self) -> bool:
        return self.runtime.transport.is_first

    @property
    def is_last(self) -> bool:
        return self.runtime.transport.is_last

    def parameters(self) -> Iterator[nn.Parameter]:
        """This rank's stage's parameters (for the user's optimiser)."""
        return self.module.parameters()

    def step(self, inputs: Any, targets: torch.Tensor | None,
             batch_size: int | None = None) -> float | None:
        """Forward and backward of one mini-batch; gradients accumulate into the stage's
        `.grad` (an asynchronous schedule also steps its optimiser). Returns the mean loss
        over the samples the last stage finished, None on other stages. `batch_size` is
        needed only on ranks that pass neither inputs nor targets."""
        size = self._size(inputs, targets, batch_size)
        res = self.runtime.executor.train_step(inputs if self.is_first else None,
                                               targets if self.is_last else None, size)
        if not self.is_last:
            return None
        replicas = self.replica_group if (self.replica_group is not None
                                          and self.replica_group.size > 1) else None
        if isinstance(self.runtime.executor, StreamExecutor):
            loss, samples = res.loss, float(res.samples)
            if replicas is not None:  # the samples every replica of the last stage finished
                both = replicas.all_reduce(torch.tensor([loss, samples], dtype=torch.float64))
                loss, samples = float(both[0]), float(both[1])
            return loss / samples if samples else None
        if replicas is not None:
            # each replica's micro-batches weighted by their share: the sum is the mean
            total = replicas.all_reduce(torch.tensor([float(res.loss or 0.0)],
                                                     dtype=torch.float64))
            return float(total.item())
        return res.loss  # the micro-batches' losses weighted by their share: the mean

    @torch.no_grad()
    def evaluate(self, inputs: Any, targets: torch.Tensor | None,
                 batch_size: int | None = None) -> tuple[float, int] | None:
        """Forward-only pipeline over one batch: (summed loss, correct predictions) on the
        last stage, None elsewhere (hits count `output.argmax(1) == targets`)."""
        size = self._size(inputs, targets, batch_size)
        compute = self.runtime.compute
        compute.reset_step()
        self.module.eval()
        try:
            self.runtime.executor.eval_batch(inputs if self.is_first else None,
                                             targets if self.is_last else None, size)
        finally:
            self.module.train()
        return (float(compute.loss_sum), int(compute.correct)) if self.is_last else None

    def _size(self, inputs: Any, targets: torch.Tensor | None, batch_size: int | None) -> int:
        if batch_size is not None:
            return batch_size
        for t in (inputs if isinstance(inputs, torch.Tensor) else None, targets):
            if t is not None:
                return int(t.shape[0])
        raise ConfigError(f"stage {self.stage} got neither inputs nor targets; pass "
                          f"batch_size= (the mini-batch's sample count) on the middle stages")

    def close(self) -> None:
        """Release the link's threads (call once, after training)."""
        self.runtime.close()


def _replicas(replicas: int | Sequence[int], stages: int | None, world: int) -> tuple[int, ...]:
    """Ranks per stage, () for one each: a count per stage, or one count for every stage
    (then the world must divide into stages of that many)."""
    if isinstance(replicas, int):
        if replicas == 1:
            return ()
        if replicas < 1 or world % replicas:
            raise ConfigError(f"replicas={replicas} must be >= 1 and divide the world of "
                              f"{world} ranks, or give one count per stage, e.g. (2, 1)")
        per = replicas
        count = stages or world // per
        counts = (per,) * count
    else:
        counts = tuple(int(r) for r in replicas)
        if stages is not None and stages != len(counts):
            raise ConfigError(f"replicas={list(counts)} names {len(counts)} stage(s) but "
                              f"stages={stages}; give one count per stage")
    if sum(counts) != world or any(r < 1 for r in counts):
        raise ConfigError(f"replicas={list(counts)} place {sum(counts)} rank(s) but the world "
                          f"has {world}; the counts (each >= 1) must add up to the world size")
    return counts if max(counts) > 1 else ()
