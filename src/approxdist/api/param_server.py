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

In async and SSP every gradient reaches its server about W - 1 updates late, which adds
momentum of its own (Mitliagkas et al. 2016): `delay_rule="auto"` (the default) lowers the
momentum of each server's optimiser by (W - 1) / W, down to 0 (`optim.delay`;
`ps.delay_line` says what it did); `delay_rule="off"` keeps the optimiser as made.

`tolerate_worker_loss=True` goes on without a worker that dies (async, SSP, N+b; the
group must then be a survivors' group, as `approxdist train --tolerate-worker-loss`'s
launcher makes), `recorder=` records every phase and transfer (docs/tracing.md), and
`state_dict()` / `load_state_dict()` save and restore every server's shard and optimiser
state and every worker's error-feedback residuals (or, with a compressor on the pushes,
`push_codec="topk:0.01"`, every worker's compressor states and the server's copies of
random-k's streams; docs/compressors.md). `approxdist train --parallel ps` runs
this class: its engine (`train/engines/param_server.py`) builds it with
`ParameterServer.from_config` and steps it with `serve_step` and `worker_step`, the steps
`serve` and `step` are made of.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.api.param_server_args import (
    check_arguments,
    checked,
    link_shaping,
    roles_of,
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
from approxdist.param_server.wire import WireFormats
from approxdist.param_server.worker import Worker
from approxdist.trace.phases import SYNC
from approxdist.trace.recorder import NULL_RECORDER, Recorder
from approxdist.trace.step import traced_backward
from approxdist.trace.times import StepTimes

LossFn = Callable[[Any, Any], torch.Tensor]


@dataclass(frozen=True)
class WorkerStep:
    """One worker step: the loss, the model's output (for the caller's scores), how many
    of the following steps this worker skips (N+b) and where its time went."""

    loss: torch.Tensor
    output: Any
    skip: int
    times: StepTimes


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
                 recorder: Recorder | None = None) -> None:
        ctx = context_of(model)
        check_rule(delay_rule, "delay_rule")
        check_arguments(ctx, model, optimizer, steps, scheduler)
        group = group if group is not None else world_group(ctx)
        roles = roles_of(servers, workers, group, ctx.world_size)
        ps_mode = parse_mode(mode, roles.workers, name="mode")
        check_backend(ps_mode.spec, ps_mode.any_source, ctx.backend, name="mode")
        if staleness_lr and ps_mode.kind in ("sync", "backup"):
            raise ConfigError(f"staleness_lr=True divides the learning rate by a gradient's "
                              f"staleness, which mode={mode!r} keeps at 0; drop it or use "
                              f"mode='async' or 'ssp:<s>'")
        if tolerate_worker_loss and ps_mode.kind == "sync":
            raise ConfigError("tolerate_worker_loss=True with mode='sync': every step waits "
                              "for a gradient from every worker, so a dead worker must end "
                              "the run; use mode='async', 'ssp:<s>' or 'backup:<b>'")
        wire = wire_formats(push_codec, pull_codec, push_channel, pull_channel)
        shaping = link_shaping(link)
        check_same_model(model, group, who="approxdist.ParameterServer")
        self._assemble(model, ctx, roles, ps_mode, wire, shaping, group, checked(optimizer),
                       steps, loss_fn, error_feedback=error_feedback, staleness_lr=staleness_lr,
                       tolerate_worker_loss=tolerate_worker_loss,
                       scheduler=None if scheduler is None else stepping(scheduler),
                       recorder=recorder or NULL_RECORDER, servers_name="servers",
                       delay_rule=delay_rule)

    @classmethod
    def from_config(cls, model: nn.Module, *, ps: PSConfig, push: Wire, pull: Wire,
                    optimizer: OptimizerFactory, steps: int, group: Group, link: str = "",
                    loss_fn: LossFn = F.cross_entropy, delay_rule: str = "auto",
                    recorder: Recorder = NULL_RECORDER) -> ParameterServer:
        """The servers and workers of a checked `[ps]` section on `group` (servers on its
        first ranks), gradients on the `push` wire and parameters on `pull`; the trainer's
        engine builds it so (`approxdist.train.check` checked the sections, and every rank
        built the same model from the same seed)."""
        ctx = context_of(model)
        roles = Roles(ps.servers, ps.workers, group.ranks)
        mode = parse_mode(ps.mode, roles.workers)
        check_backend(mode.spec, mode.any_source, ctx.backend)
        obj = cls.__new__(cls)
        obj._assemble(model, ctx, roles, mode, WireFormats.of(push, pull), link_shaping(link),
                      group, optimizer, steps, loss_fn, error_feedback=push.error_feedback,
                      staleness_lr=ps.staleness_lr,
                      tolerate_worker_loss=ps.tolerate_worker_loss, scheduler=None,
                      recorder=recorder, servers_name="--servers", delay_rule=delay_rule)
        return obj

    def _assemble(self, model: nn.Module, ctx: DistContext, roles: Roles, mode: PSMode,
                  wire: WireFormats, shaping: Any, group: Group, optimizer: OptimizerFactory,
                  steps: int, loss_fn: LossFn, *, error_feedback: bool, staleness_lr: bool,
                  tolerate_worker_loss: bool, scheduler: SchedulerFactory | None,
                  recorder: Recorder, servers_name: str, delay_rule: str) -> None:
        """This rank's node; a factory's bad result on a server is refused on every rank
        (one gather), so that no worker waits for a server that will not start."""
        self.module, self.roles, self.group, self.steps = model, roles, group, steps
        self.loss_fn, self.recorder, self.wire = loss_fn, recorder, wire
        self.link = Link(ctx, shaping, hook=recorder.transfer_hook(), group=group)
        node, problem = None, ""
        try:
            node = PSNode(model, roles, mode, self.link, group, wire, optimizer, steps,
                          error_feedback=error_feedback, staleness_lr=staleness_lr,
                          tolerate_worker_loss=tolerate_worker_loss, servers_name=servers_name,
                          scheduler=scheduler, delay_rule=delay_rule)
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
        server = self._server("serve_step()")
        with self.recorder.span(SYNC):
            log = self.node.serve_step()
        for worker, read, at in log.order:  # the arrival order, a marker each (a replay's input)
            self.recorder.instant("push", worker=worker, read=read, at=at)
        return log.record(server.rules.version)

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
        rec, module = self.recorder, self.module
        t0 = time.perf_counter()
        output, loss = traced_backward(rec, module, self.loss_fn, inputs, targets,
                                       lambda: module.zero_grad(set_to_none=True))
        t1 = time.perf_counter()
        with rec.span(SYNC):
            skip = self.node.push_pull()
        t2 = time.perf_counter()
        return WorkerStep(loss.detach(), output, skip,
                          StepTimes(compute_s=t1 - t0, wait_s=t2 - t1, wall_s=t2 - t0))

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
        mine: dict[str, Any] = {"steps": self.node.steps_run}
        server, worker = self.node.server, self.node.worker
        if server is not None:
            mine["server"] = {"params": [p.detach().cpu().clone() for p in server.params],
                              "optimizer": server.optimizer.state_dict()}
            if server.decoders is not None:
                mine["server"]["decoders"] = server.decoders.state_dict()
        elif worker is not None and worker.keeps_state:
            mine["feedback"] = (worker.index, worker.state_dict())
        gathered = self.group.all_gather_object(mine)
        return {"servers": [g["server"] for g in gathered if "server" in g],
                "feedback": {str(w): f for w, f in (g["feedback"] for g in gathered
                                                     if "feedback" in g)},
                "buffers": {k: b.detach().cpu().clone() for k, b in self.module.named_buffers()},
                "steps": max(g["steps"] for g in gathered)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put `state` back on every rank (a collective: the workers then pull the loaded
        parameters)."""
        servers = state["servers"]
        if len(servers) != self.roles.servers:
            raise ConfigError(f"the state holds {len(servers)} server shard(s) but this run "
                              f"has {self.roles.servers} server(s); load it with "
                              f"--servers {len(servers)} (servers={len(servers)})")
        server, worker = self.node.server, self.node.worker
        if server is not None:
            saved = servers[server.index]
            with torch.no_grad():
                for p, v in zip(server.params, saved["params"]):
                    p.copy_(v)
            server.optimizer.load_state_dict(saved["optimizer"])
            if server.decoders is not None:
                server.decoders.load_state_dict(saved.get("decoders", {}))
        if worker is not None and worker.keeps_state:
            # a worker lost before the state was saved has none: it starts from zero
            worker.load_state_dict(state.get("feedback", {}).get(str(worker.index), {}))
        buffers = dict(self.module.named_buffers())
        with torch.no_grad():
            for name, value in state.get("buffers", {}).items():
                buffers[name].copy_(value)
        self.node.steps_run = int(state.get("steps", 0))
        self.node.start()  # every worker starts again from the servers' parameters
        if server is not None:
            server.settle()  # the replies are out before the server goes on (or closes)

    def local_state(self) -> dict[str, Any]:
        """This rank's state without collectives, as references (an in-process snapshot
        copies it; AdaPrec): the model (a server's shard is its parameters), a server's
        optimiser state and bookkeeping, a worker's residuals and versions, the round's
        counters. Only between steps of a sync run, where nothing is in flight."""
        if self.node.mode.kind != "sync":
            raise ConfigError(f"mode {self.node.mode.spec!r} keeps pushes in flight across "
                              f"steps: a rank's state at a step is not its own; snapshots "
                              f"need mode 'sync'")
        node, server, worker = self.node, self.node.server, self.node.worker
        out: dict[str, Any] = {"module": self.module.state_dict(),
                               "counters": (node.done, node.steps_run, node.skipped)}
        if server is not None:
            out["server"] = {"optimizer": server.optimizer.state_dict(), "rules": server.rules,
                             "histogram": server.histogram,
                             "decoders": server.decoders.state_dict()
                             if server.decoders is not None else {}}
        if worker is not None:
            out["worker"] = {"versions": worker.versions, "base": worker.base,
                             "feedback": worker.state_dict()}
        return out

    def load_local_state(self, state: Mapping[str, Any]) -> None:
        node, server, worker = self.node, self.node.server, self.node.worker
        self.module.load_state_dict(state["module"])
        node.done, node.steps_run, node.skipped = state["counters"]
        if server is not None:
            server.optimizer.load_state_dict(state["server"]["optimizer"])
            server.rules, server.histogram = state["server"]["rules"], state["server"]["histogram"]
            if server.decoders is not None:
                server.decoders.load_state_dict(state["server"]["decoders"])
        if worker is not None:
            worker.versions = list(state["worker"]["versions"])
            worker.base = list(state["worker"]["base"])
            worker.load_state_dict(state["worker"]["feedback"])

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
