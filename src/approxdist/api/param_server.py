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

A *round* is `steps` calls of `step` on every worker and one `serve` on every server
(an epoch, say); its last step leaves every worker with the servers' final parameters in
`ps.module` and the mean of the workers' floating-point buffers. In N+b (`mode="backup:b"`)
`step` returns None for the mini-batches a worker skips. The options (`scheduler=`,
`delay_rule=`, `tolerate_worker_loss=`, `recorder=`, compressors on the pushes) and the
saved state are in docs/api.md; `param_server_args` checks the arguments and
`param_server.state` saves and restores a run. `approxdist train --parallel ps` runs this
class: its engine (`train/engines/param_server.py`) builds it with
`ParameterServer.from_config` and steps it with `serve_step` and `worker_step`, the steps
`serve` and `step` are made of.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.api.param_server_args import (
    check_arguments,
    check_mode_options,
    checked,
    link_shaping,
    placed,
    stepping,
    wire_formats,
)
from approxdist.comm.codecs import get_codec
from approxdist.comm.link import Link
from approxdist.config.ps import PSConfig
from approxdist.config.wire import Wire
from approxdist.data_parallel.checks import check_same_model, context_of
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, world_group
from approxdist.optim.delay import check_rule
from approxdist.param_server.modes import PSMode, parse_mode
from approxdist.param_server.node import (
    OptimizerFactory,
    PSNode,
    Scheduler,
    SchedulerFactory,
    check_backend,
)
from approxdist.param_server.roles import Roles
from approxdist.param_server.server import Server
from approxdist.param_server.state import gather_state, load_local_state, load_state, local_state
from approxdist.param_server.steps import LossFn, WorkerStep, serve_step, worker_step
from approxdist.param_server.wire import WireFormats
from approxdist.param_server.worker import Worker
from approxdist.trace.recorder import NULL_RECORDER, Recorder


class ParameterServer:
    """This rank as a server or a worker of a parameter-server run of `model`."""

    def __init__(self, model: nn.Module, *, optimizer: OptimizerFactory, steps: int,
                 servers: int | Sequence[int] = 1, workers: int | Sequence[int] | None = None,
                 mode: str = "sync", loss_fn: LossFn = F.cross_entropy,
                 push_codec: str = "fp32", pull_codec: str = "fp32",
                 push_channel: str = "none", pull_channel: str = "none",
                 error_feedback: bool = False, link: str = "", staleness_lr: bool = False,
                 scheduler: SchedulerFactory | None = None, group: Group | None = None,
                 tolerate_worker_loss: bool = False, delay_rule: str = "auto",
                 seed: int = 0, recorder: Recorder | None = None) -> None:
        """`seed`: the run's seed, which a push compressor's random streams derive from with
        each parameter's name (docs/compressors.md); the rest: docs/api.md."""
        ctx = context_of(model)
        check_rule(delay_rule, "delay_rule")
        check_arguments(ctx, model, optimizer, steps, scheduler)
        group = group if group is not None else world_group(ctx)
        roles, ps_mode = placed(ctx, group, servers, workers, mode)
        check_mode_options(ps_mode, mode, staleness_lr=staleness_lr,
                           tolerate_worker_loss=tolerate_worker_loss)
        wire = wire_formats(push_codec, pull_codec, push_channel, pull_channel)
        shaping = link_shaping(link)
        check_same_model(model, group, who="approxdist.ParameterServer")
        self._assemble(model, ctx, group, roles, ps_mode, wire, shaping, checked(optimizer),
                       steps, loss_fn, recorder or NULL_RECORDER, error_feedback=error_feedback,
                       staleness_lr=staleness_lr, tolerate_worker_loss=tolerate_worker_loss,
                       scheduler=None if scheduler is None else stepping(scheduler),
                       servers_name="servers", delay_rule=delay_rule, seed=seed)

    @classmethod
    def from_config(cls, model: nn.Module, *, ps: PSConfig, push: Wire, pull: Wire,
                    optimizer: OptimizerFactory, steps: int, group: Group, link: str = "",
                    loss_fn: LossFn = F.cross_entropy, delay_rule: str = "auto",
                    seed: int = 0, recorder: Recorder = NULL_RECORDER) -> ParameterServer:
        """The servers and workers of a checked `[ps]` section on `group` (servers on its
        first ranks), gradients on the `push` wire and parameters on `pull`; the trainer's
        engine builds it so (`approxdist.train.check` checked the sections, and every rank
        built the same model from the same `seed`, the run's, which also seeds a push
        compressor's streams)."""
        ctx = context_of(model)
        roles = Roles(ps.servers, ps.workers, group.ranks)
        mode = parse_mode(ps.mode, roles.workers)
        check_backend(mode.spec, mode.any_source, ctx.backend)
        obj = cls.__new__(cls)
        obj._assemble(model, ctx, group, roles, mode, WireFormats.of(push, pull),
                      link_shaping(link), optimizer, steps, loss_fn, recorder,
                      error_feedback=push.error_feedback, staleness_lr=ps.staleness_lr,
                      tolerate_worker_loss=ps.tolerate_worker_loss, servers_name="--servers",
                      delay_rule=delay_rule, seed=seed)
        return obj

    def _assemble(self, model: nn.Module, ctx: DistContext, group: Group, roles: Roles,
                  mode: PSMode, wire: WireFormats, shaping: Any, optimizer: OptimizerFactory,
                  steps: int, loss_fn: LossFn, recorder: Recorder, **options: Any) -> None:
        """This rank's node (`options`: `PSNode`'s); a factory's bad result on a server is
        refused on every rank (one gather), so that no worker waits for a server that will
        not start."""
        self.module, self.roles, self.group, self.steps = model, roles, group, steps
        self.loss_fn, self.recorder, self.wire = loss_fn, recorder, wire
        self.link = Link(ctx, shaping, hook=recorder.transfer_hook(), group=group)
        node, problem = None, ""
        try:
            node = PSNode(model, roles, mode, self.link, group, wire, optimizer, steps, **options)
        except ConfigError as exc:
            problem = str(exc)
        problems = [p for p in group.all_gather_object(problem) if p]
        if problems or node is None:
            self.link.close()
            raise ConfigError(problems[0] if problems else problem)
        self.node = node
        self._calls = 0    # steps of this round called
        self._covered = 0  # of them, taken or skipped by the last push (N+b skips ahead)
        self.node.start()

    # -- who this rank is ---------------------------------------------------------------------
    @property
    def is_server(self) -> bool:
        return self.node.server is not None

    @property
    def index(self) -> int:
        """This rank's server index, or worker index."""
        return self.roles.index(self.link.me)

    @property
    def server(self) -> Server | None:
        return self.node.server

    @property
    def delay_line(self) -> str | None:
        """On a server, one line on the delay rule (`optim.delay`): the momentum it runs an
        asynchronous mode's late gradients with, or, with `delay_rule="off"`, the stable
        room the optimiser's momentum leaves; None on workers, in sync and N+b."""
        return self.node.delay_line

    @property
    def worker(self) -> Worker | None:
        return self.node.worker

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimiser of this server's shard (None on a worker)."""
        return self.node.server.optimizer if self.node.server is not None else None

    @property
    def scheduler(self) -> Scheduler | None:
        """The learning-rate scheduler of this server's optimiser (None on a worker, or
        without `scheduler=`)."""
        return self.node.scheduler

    @property
    def live_workers(self) -> list[int]:
        """The global ranks of the workers alive at the last round's end."""
        return self.node.live_workers

    # -- steps ------------------------------------------------------------------------------
    def serve_step(self) -> dict[str, object]:
        """On a server: one server step (the round's last also drains the pushes still
        due). Returns what it did: the staleness of each applied gradient, each push's lead
        over the slowest worker, the workers applied from and dropped, the version after, and
        `order`: every push in arrival order as [worker, version read, version applied to]
        (None: dropped), also a `push` marker each in the trace."""
        self._server("serve_step()")
        return serve_step(self.node, self.recorder)

    def serve(self) -> list[dict[str, object]]:
        """On a server: serve one round, until every worker has taken `steps` steps; what
        each server step did (`serve_step`)."""
        self._server("serve()")
        records = [self.serve_step() for _ in range(self.steps)]
        self.end_round()
        return records

    def worker_step(self, inputs: Any, targets: Any) -> WorkerStep:
        """On a worker: forward, `loss_fn(model(inputs), targets)`, backward, push the
        gradients, pull the parameters; the loss, the output and the steps skipped after."""
        if self.node.worker is None:
            raise ConfigError(f"{self.roles.describe(self.link.me)} holds parameters: call "
                              f"serve() on it, not step() (ps.is_server tells the ranks apart)")
        return worker_step(self.node, self.loss_fn, self.recorder, inputs, targets)

    def step(self, inputs: Any, targets: Any) -> float | None:
        """On a worker: one `worker_step`; the loss, or None for a mini-batch this worker
        skips (N+b). The round's last step also ends the round."""
        self._calls += 1
        value = None
        if self._calls > self._covered:
            done = self.worker_step(inputs, targets)
            self._covered = self._calls + done.skip
            value = float(done.loss)
            if self.node.round_over:
                self.end_round()
        if self._calls == self.steps:
            self._calls = self._covered = 0
        return value

    def end_round(self) -> None:
        """Every worker pulls the servers' final parameters (asynchronous modes leave them a
        step behind) and the (surviving) workers average their floating-point buffers; a
        collective over the group."""
        self.node.end_round()

    def _server(self, call: str) -> Server:
        if self.node.server is None:
            raise ConfigError(f"{self.roles.describe(self.link.me)} computes gradients: call "
                              f"step(inputs, targets) on it, not {call} (ps.is_server tells "
                              f"the ranks apart)")
        return self.node.server

    @property
    def skipped(self) -> int:
        """Steps this worker skipped over the run (N+b)."""
        return self.node.skipped

    # -- state and figures ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every server's shard and optimiser state and every (surviving) worker's
        error-feedback residuals, gathered on every rank (a collective over the group);
        the floating-point buffers (equal on every worker after a round)."""
        return gather_state(self.node)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put `state` back on every rank (a collective: the workers then pull the loaded
        parameters)."""
        load_state(self.node, state)

    def local_state(self) -> dict[str, Any]:
        """This rank's state without collectives, as references (an in-process snapshot
        copies it; AdaPrec); only between steps of a sync run (`param_server.state`)."""
        return local_state(self.node)

    def load_local_state(self, state: Mapping[str, Any]) -> None:
        load_local_state(self.node, state)

    def set_push_codec(self, codec: str) -> None:
        """Send the next pushes in `codec` (every rank switches, servers decode with it;
        the workers' residuals kept: AdaPrec; a codec, not a compressor)."""
        wire = dataclasses.replace(self.wire, push=get_codec(codec))
        self.wire = wire
        for end in (self.node.server, self.node.worker):
            if end is not None:
                end.wire = wire

    def link_bytes(self) -> dict[str, int]:
        """Bytes this rank sent so far per directed link `"i->j"`."""
        return self.link.stats.as_dict(self.link.me)

    def summary(self) -> dict[str, Any]:
        """Servers, workers, mode, bytes per shard; on a server also the staleness
        histogram of its applied gradients, its updates, drops and pushes per worker."""
        return self.node.summary()

    def close(self) -> None:
        """Release the link (call once, after training)."""
        self.link.close()
