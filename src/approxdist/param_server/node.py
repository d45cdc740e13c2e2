"""This rank's end of a parameter-server run of any model: the pieces the trainer's engine
(`train.engines.param_server`) and the public API (`approxdist.ParameterServer`) share.

A `PSNode` shards the model's parameters over the servers (`sharding`), builds this
rank's `Server` (with the optimiser the caller's factory makes over its shard, its
momentum lowered for the mode's gradient delay by the delay rule, `optim.delay`, and
optionally a learning-rate scheduler of that optimiser) or `Worker`, and runs a *round*
of `steps` steps (the trainer's epoch): a server step serves pushes under the mode; a
worker step pushes the gradients in `.grad` and pulls the parameters, and in N+b says
how many steps the worker skips. A server's scheduler steps once after each server step,
so server step k runs at the rate it gives after k steps: what `train --parallel ps` does
with its lr rule, which the trainer sets on the servers' optimisers before each step from
the step's index. `end_round` leaves every worker with the servers' final parameters and
the mean of the workers' floating-point buffers (batch-norm statistics), a collective
over the node's group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from approxdist.comm.link import Link
from approxdist.data_parallel.buffer_stats import average_float_buffers
from approxdist.errors import ConfigError
from approxdist.launch.group import Group
from approxdist.optim.delay import apply_delay_rule, delay_line
from approxdist.param_server.modes import PSMode
from approxdist.param_server.roles import Roles
from approxdist.param_server.rules import ServerRules
from approxdist.param_server.server import Server
from approxdist.param_server.sharding import shard_by_bytes, shard_bytes
from approxdist.param_server.steplog import StepLog
from approxdist.param_server.wire import WireFormats
from approxdist.param_server.worker import Worker

#: the optimiser a server steps over its shard, from the shard's parameters
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


class Scheduler(Protocol):
    """What a server steps after each server step: a `torch.optim.lr_scheduler.LRScheduler`
    or anything with `step()`."""

    def step(self) -> Any: ...


#: the scheduler of a server's optimiser, from the optimiser
SchedulerFactory = Callable[[torch.optim.Optimizer], Scheduler]


class PSNode:
    """`model`'s parameters sharded over `roles`' servers; this rank (`link.me`) as a
    server or a worker of rounds of `steps` steps under `mode`. `group` holds every
    server and worker (the end-of-round buffer average runs over it); `seed`, the run's,
    seeds a push compressor's random streams with each parameter's name."""

    def __init__(self, model: nn.Module, roles: Roles, mode: PSMode, link: Link, group: Group,
                 wire: WireFormats, optimizer: OptimizerFactory, steps: int, *,
                 error_feedback: bool = False, staleness_lr: bool = False,
                 tolerate_worker_loss: bool = False, servers_name: str = "--servers",
                 scheduler: SchedulerFactory | None = None, delay_rule: str = "auto",
                 seed: int = 0) -> None:
        self.module, self.roles, self.mode, self.link, self.group = model, roles, mode, link, group
        self.steps = steps
        named = list(model.named_parameters())
        self.sizes = [p.numel() * p.element_size() for _, p in named]
        self.shards = shard_by_bytes(self.sizes, roles.servers, servers_name)
        self.server: Server | None = None
        self.worker: Worker | None = None
        self.scheduler: Scheduler | None = None
        #: what the delay rule did to a server's momentum, or why it would (None: nothing)
        self.delay_line: str | None = None
        if roles.is_server(link.me):
            k = roles.index(link.me)
            params = [named[i][1] for i in self.shards[k]]
            opt = optimizer(params)
            delay = mode.delay(roles.workers)
            self.delay_line = delay_line(
                float(opt.param_groups[0].get("momentum", 0.0)), [delay], delay_rule,
                f"at the servers ({mode.spec}, {roles.workers} workers)")
            apply_delay_rule(opt, delay, delay_rule)
            self.server = Server(link, roles, k, params, opt,
                                 ServerRules(mode, roles.workers), wire, staleness_lr,
                                 tolerate_worker_loss, [named[i][0] for i in self.shards[k]], seed)
            if scheduler is not None:
                self.scheduler = scheduler(self.server.optimizer)
        else:
            self.worker = Worker(link, roles, roles.index(link.me),
                                 [[named[i][1] for i in s] for s in self.shards],
                                 [[named[i][0] for i in s] for s in self.shards], wire,
                                 error_feedback, seed)
        self.done = 0     # steps of this round taken or skipped
        self.skipped = 0  # steps this worker skipped over the run (N+b)
        self.steps_run = 0  # steps this rank has taken over the run (skips included)
        #: the workers this server found dead: worker, rank, the step and round of each
        self.lost: list[dict[str, int]] = []
        #: the workers' global ranks at the last round's end, as every surviving rank agrees
        self.live_workers = [roles.worker_rank(w) for w in range(roles.workers)]

    def start(self) -> None:
        """Every worker starts from the servers' parameters."""
        if self.server is not None:
            self.server.start()
        else:
            assert self.worker is not None
            self.worker.pull()

    @property
    def round_over(self) -> bool:
        return self.done >= self.steps

    def serve_step(self) -> StepLog:
        """One server step; the round's last also drains the pushes still due. Then the
        scheduler (if any) steps: once per server step, whatever the mode applied in it
        (sync, N+b: one update; async, SSP: one per push)."""
        assert self.server is not None
        self.done += 1
        self.steps_run += 1
        log = self.server.step(self.done == self.steps, self.steps)
        self._note_losses(self.server)
        if self.scheduler is not None:
            self.scheduler.step()
        return log

    def push_pull(self) -> int:
        """A worker's step after its backward: push, pull; the steps it skips after this
        one. In N+b a worker goes on at the step the slowest server has reached (Chen et
        al. 2016): a dropped worker skips the steps taken without it, and pushes only to
        the servers whose round is not over (`ServerRules.owed` counts on it)."""
        worker = self.worker
        assert worker is not None
        self.done += 1
        self.steps_run += 1
        if self.mode.kind != "backup":
            worker.push_pull()
            return 0
        worker.push_pull([k for k, n in enumerate(worker.updates_seen()) if n < self.steps])
        after = min(self.steps, *worker.updates_seen())
        skip = max(0, after - self.done)
        self.done += skip
        self.steps_run += skip
        self.skipped += skip
        return skip

    def _note_losses(self, server: Server) -> None:
        for w in server.newly_lost:
            self.lost.append({"worker": w, "rank": self.roles.worker_rank(w),
                              "step": self.steps_run,
                              "epoch": (self.steps_run - 1) // self.steps + 1})
        server.newly_lost.clear()

    def end_round(self) -> None:
        """The round is over on this rank: asynchronous modes leave workers a step behind,
        so the servers send their parameters once more; the ranks agree on the surviving
        workers (`live_workers`; all of them unless a worker was lost under
        `--tolerate-worker-loss`, where the group is a survivors' group); then the buffers
        are averaged over them."""
        self.done = 0
        if self.mode.kind != "sync":
            if self.server is not None:
                self.server.reply(range(self.roles.workers))
                self.server.settle()
                self._note_losses(self.server)
            else:
                assert self.worker is not None
                self.worker.pull()
        rows = self.group.all_gather_object((self.link.me, self.worker is not None))
        self.live_workers = [rank for rank, is_worker in rows if is_worker]
        self._average_buffers()

    def _average_buffers(self) -> None:
        """Batch-norm statistics: the mean over the (surviving) workers; servers add
        zeros and count none."""
        average_float_buffers(self.module, self._mean_over_workers, torch.float64)

    def _mean_over_workers(self, flat: torch.Tensor) -> torch.Tensor:
        """One more element counts the workers that added their values."""
        flat = torch.cat([flat, torch.ones(1, dtype=flat.dtype, device=flat.device)])
        if self.worker is None:
            flat.zero_()
        self.group.all_reduce(flat)
        return flat[:-1] / flat[-1]

    def summary(self) -> dict[str, Any]:
        """Servers, workers, mode and bytes per shard; on a server also its staleness
        histogram, updates, dropped gradients and pushes per worker."""
        out: dict[str, Any] = {"servers": self.roles.servers, "workers": self.roles.workers,
                               "mode": self.mode.spec,
                               "shard_bytes": shard_bytes(self.sizes, self.shards)}
        if self.server is not None:
            rules = self.server.rules
            out.update({"staleness_histogram": {str(k): v for k, v in
                                                sorted(self.server.histogram.items())},
                        "updates": rules.version, "dropped": rules.dropped,
                        "pushes": list(rules.clocks), "lost_workers": self.lost})
        return out


def check_backend(mode: str, any_source: bool, backend: str, name: str = "--ps-mode") -> None:
    """Refuse a mode that receives from any source on NCCL, which cannot."""
    if any_source and backend == "nccl":
        cli = name.startswith("-")
        shown = f"{name} {mode}" if cli else f"{name}={mode!r}"
        fix = "--device cpu (gloo) or --ps-mode sync" if cli else \
            "a CPU model on a gloo process group, or mode='sync'"
        raise ConfigError(f"{shown} has the server take pushes in arrival order "
                          f"(receive from any source), which NCCL cannot; use {fix}")

