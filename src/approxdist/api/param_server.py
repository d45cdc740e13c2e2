"""`approxdist.ParameterServer`: parameter-server training (seed 003) of a user's own model,
data, loss and loop.

Every rank builds the same model (any `nn.Module`, from the same seed) and wraps it; the
parameters are sharded over the server ranks, balanced by bytes, and each server steps
the optimiser the user's factory makes over its shard. It runs on the engine of
`approxdist train --parallel ps` (`param_server.node.PSNode`: the same sharding, server
loop, wire protocol, modes and error feedback), so every mode, codec, channel, emulated
link and byte count applies:

    dist.init_process_group("gloo")
    ps = approxdist.ParameterServer(model, servers=1, mode="sync", steps=len(batches),
                                    optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
                                    loss_fn=F.cross_entropy)
    if ps.is_server:
        ps.serve()                       # until the workers have taken `steps` steps
    else:
        for x, y in my_share_of(batches):
            loss = ps.step(x, y)         # forward, backward, push, pull
    ps.close()

`scheduler=` (optional) makes a learning-rate schedule of each server's optimiser, e.g.
`scheduler=lambda opt: torch.optim.lr_scheduler.LinearLR(opt, 0.1, total_iters=100)`;
a server steps it once after each server step (as `train --parallel ps` applies its lr
rule): in sync and N+b mode after each update, in async and SSP after each W pushes.

A *round* is `steps` calls of `step` on every worker and one `serve` on every server
(call both again for another round, an epoch say). Its last step leaves every worker
with the servers' final parameters in `ps.module` (asynchronous modes pull them once
more) and the mean of the workers' floating-point buffers. In N+b (`mode="backup:b"`) a
worker whose gradient came late skips the steps taken without it: `step` then returns
None for the mini-batches it skips, without computing them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.comm.channel import get_channel
from approxdist.comm.codecs import get_codec
from approxdist.comm.link import Link
from approxdist.comm.netem import parse_link
from approxdist.data_parallel.checks import check_same_model, context_of
from approxdist.errors import ConfigError, SpecError
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, check_ranks, world_group
from approxdist.param_server.modes import PSMode, parse_mode
from approxdist.param_server.node import (
    OptimizerFactory,
    PSNode,
    Scheduler,
    SchedulerFactory,
    check_backend,
)
from approxdist.param_server.roles import Roles
from approxdist.param_server.wire import WireFormats

LossFn = Callable[[Any, Any], torch.Tensor]


class ParameterServer:
    """This rank as a server or a worker of a parameter-server run of `model`."""

    def __init__(self, model: nn.Module, *, optimizer: OptimizerFactory, steps: int,
                 servers: int | Sequence[int] = 1, workers: int | Sequence[int] | None = None,
                 mode: str = "sync", loss_fn: LossFn = F.cross_entropy,
                 push_codec: str = "fp32", pull_codec: str = "fp32",
                 push_channel: str = "none", pull_channel: str = "none",
                 error_feedback: bool = False, link: str = "", staleness_lr: bool = False,
                 scheduler: SchedulerFactory | None = None, group: Group | None = None) -> None:
        ctx = context_of(model)
        _check_arguments(ctx, model, optimizer, steps, scheduler)
        self.group = group if group is not None else world_group(ctx)
        self.roles = _roles(servers, workers, self.group, ctx.world_size)
        ps_mode = parse_mode(mode, self.roles.workers, name="mode")
        check_backend(ps_mode.spec, ps_mode.any_source, ctx.backend, name="mode")
        wire = WireFormats(_spec(get_codec, "push_codec", push_codec),
                           _spec(get_codec, "pull_codec", pull_codec),
                           _channel("push_channel", push_channel),
                           _channel("pull_channel", pull_channel))
        shaping = _spec(parse_link, "link", link)
        check_same_model(model, self.group, who="approxdist.ParameterServer")
        self.steps, self.loss_fn = steps, loss_fn
        self.link = Link(ctx, shaping, group=self.group)
        self.node = self._node(model, ps_mode, wire, optimizer, scheduler, steps,
                               error_feedback, staleness_lr)
        self.module = model
        self._calls = 0    # steps of this round called
        self._covered = 0  # of them, taken or skipped by the last push (N+b skips ahead)
        self.node.start()

    def _node(self, model: nn.Module, mode: PSMode, wire: WireFormats,
              optimizer: OptimizerFactory, scheduler: SchedulerFactory | None, steps: int,
              error_feedback: bool, staleness_lr: bool) -> PSNode:
        """This rank's node; a factory's bad result on a server is refused on every rank
        (one gather), so that no worker waits for a server that will not start."""
        node, problem = None, ""
        try:
            node = PSNode(model, self.roles, mode, self.link, self.group, wire,
                          _checked(optimizer), steps, error_feedback=error_feedback,
                          staleness_lr=staleness_lr, servers_name="servers",
                          scheduler=None if scheduler is None else _stepping(scheduler))
        except ConfigError as exc:
            problem = str(exc)
        problems = [p for p in self.group.all_gather_object(problem) if p]
        if problems or node is None:
            self.link.close()
            raise ConfigError(problems[0] if problems else problem)
        return node

    @property
    def is_server(self) -> bool:
        return self.node.server is not None

    @property
    def index(self) -> int:
        """This rank's server index, or worker index."""
        return self.roles.index(self.link.me)

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimiser of this server's shard (None on a worker)."""
        return self.node.server.optimizer if self.node.server is not None else None

    @property
    def scheduler(self) -> Scheduler | None:
        """The learning-rate scheduler of this server's optimiser (None on a worker, or
        without `scheduler=`)."""
        return self.node.scheduler

    def serve(self) -> list[dict[str, object]]:
        """On a server: serve one round, until every worker has taken `steps` steps.
        Returns what each server step did: the staleness of each applied gradient, each
        push's lead over the slowest worker, the workers applied from and dropped, and
        the server's version after the step."""
        server = self.node.server
        if server is None:
            raise ConfigError(f"{self.roles.describe(self.link.me)} computes gradients: call "
                              f"step(inputs, targets) on it, not serve() (ps.is_server tells "
                              f"the ranks apart)")
        records = [self.node.serve_step().record(server.rules.version)
                   for _ in range(self.steps)]
        self.node.end_round()
        return records

    def step(self, inputs: Any, targets: Any) -> float | None:
        """On a worker: forward, `loss_fn(model(inputs), targets)`, backward, push the
        gradients, pull the parameters. Returns the loss, or None for a mini-batch this
        worker skips (N+b). The round's last step also ends the round."""
        if self.node.worker is None:
            raise ConfigError(f"{self.roles.describe(self.link.me)} holds parameters: call "
                              f"serve() on it, not step() (ps.is_server tells the ranks apart)")
        self._calls += 1
        value = None
        if self._calls > self._covered:
            self.module.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.module(inputs), targets)
            loss.backward()
            self._covered = self._calls + self.node.push_pull()
            value = float(loss.detach())
            if self.node.round_over:
                self.node.end_round()
        if self._calls == self.steps:
            self._calls = self._covered = 0
        return value

    @property
    def skipped(self) -> int:
        """Steps this worker skipped over the run (N+b)."""
        return self.node.skipped

    def summary(self) -> dict[str, Any]:
        """Servers, workers, mode, bytes per shard; on a server also the staleness
        histogram of its applied gradients, its updates, drops and pushes per worker."""
        return self.node.summary()

    def close(self) -> None:
        """Release the link (call once, after training)."""
        self.link.close()


def _check_arguments(ctx: DistContext, model: nn.Module, optimizer: object, steps: object,
                     scheduler: object) -> None:
    if not ctx.distributed:
        raise ConfigError("approxdist.ParameterServer needs torch.distributed: call "
                          "dist.init_process_group(...) on every rank first (e.g. under "
                          "torchrun), one rank per server and per worker")
    if not callable(optimizer):
        raise ConfigError(f"optimizer={optimizer!r} must be a function of a server's "
                          f"parameters, e.g. optimizer=lambda params: "
                          f"torch.optim.SGD(params, lr=0.1)")
    if scheduler is not None and not callable(scheduler):
        raise ConfigError(f"scheduler={scheduler!r} must be a function of a server's "
                          f"optimizer, e.g. scheduler=lambda opt: "
                          f"torch.optim.lr_scheduler.LinearLR(opt, 0.1, total_iters=100)")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps={steps!r} must be the number of mini-batches each worker "
                          f"steps per round (>= 1), e.g. steps=len(batches)")
    if not any(True for _ in model.parameters()):
        raise ConfigError(f"the model ({type(model).__name__}) has no parameters for the "
                          f"servers to hold")


def _roles(servers: int | Sequence[int], workers: int | Sequence[int] | None, group: Group,
           world: int) -> Roles:
    """Servers then workers as global ranks of `group`: counts take its members in order."""
    members, n = group.ranks, group.size
    if isinstance(servers, int):
        if not 1 <= servers < n:
            raise ConfigError(f"servers={servers} must be >= 1 and leave at least one of the "
                              f"{n} ranks for the workers; e.g. servers=1")
        held = members[:servers]
    else:
        held = check_ranks(servers, world, f"servers={list(servers)}")
    rest = tuple(r for r in members if r not in held)
    if workers is None or isinstance(workers, int):
        if workers is not None and workers != len(rest):
            raise ConfigError(f"servers={servers} and workers={workers} make "
                              f"{len(held) + workers} rank(s) but the group has {n}; use "
                              f"workers={len(rest)} (or leave it out)")
        computing = rest
    else:
        computing = check_ranks(workers, world, f"workers={list(workers)}")
    both = sorted(set(held) & set(computing))
    if both:
        raise ConfigError(f"servers={list(held)} and workers={list(computing)} both name "
                          f"rank(s) {both}; give each rank one role")
    outside = sorted(set(held + computing) - set(members))
    left = sorted(set(members) - set(held + computing))
    if outside or left or not computing:
        why = (f"name rank(s) {outside} outside the group {list(members)}" if outside else
               f"leave rank(s) {left} of the group without a role" if left else
               "leave no rank for the workers")
        raise ConfigError(f"servers={list(held)} and workers={list(computing)} {why}; name "
                          f"every rank of the group once (or pass group= of the ranks used)")
    return Roles(len(held), len(computing), tuple(held) + tuple(computing))


def _spec(parse: Callable[[str], Any], name: str, value: str) -> Any:
    """`parse(value)`, with a bad spec's message naming the argument."""
    if name == "link" and not value:
        return None
    try:
        return parse(value)
    except SpecError as exc:
        raise ConfigError(f"{name}={value!r}: {exc}") from exc


def _channel(name: str, value: str) -> Any:
    return None if value in ("", "none") else _spec(get_channel, name, value)


def _checked(factory: OptimizerFactory) -> OptimizerFactory:
    """`factory`, refusing what is not an optimiser."""
    def make(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        opt = factory(params)
        if not isinstance(opt, torch.optim.Optimizer):
            raise ConfigError(f"optimizer= returned {type(opt).__name__}, not a "
                              f"torch.optim.Optimizer; e.g. optimizer=lambda params: "
                              f"torch.optim.SGD(params, lr=0.1)")
        return opt
    return make


def _stepping(factory: SchedulerFactory) -> SchedulerFactory:
    """`factory`, refusing what has no `step()`."""
    def make(optimizer: torch.optim.Optimizer) -> Scheduler:
        made = factory(optimizer)
        if not callable(getattr(made, "step", None)):
            raise ConfigError(f"scheduler= returned {type(made).__name__}, which has no "
                              f"step(); return a learning-rate scheduler of the optimizer "
                              f"it is given, e.g. scheduler=lambda opt: "
                              f"torch.optim.lr_scheduler.LinearLR(opt, 0.1, total_iters=100)")
        return made
    return make
