"""Parameter-server training (seed 003): servers hold the parameter shards and the
optimiser, workers compute gradients on their share of every global batch.

Ranks 0..S-1 are servers, S..S+W-1 workers (`param_server.Roles`). The trainer sets the
learning rate on the servers' optimisers (a worker has none). A worker's step is forward,
backward, push and pull (`param_server.Worker`); a server's step serves pushes under the
run's `--ps-mode` (`param_server.Server`) and reports, as rank 0, the staleness of every
gradient it applied in the step's record of metrics.jsonl. After each epoch every worker
pulls the final parameters (asynchronous modes leave them a little behind) and the
workers average their batch-norm statistics, so evaluation sees the servers' model.

With `--tolerate-worker-loss` the world is a `launch.survivors.SurvivorGroup`: a server
goes on without a worker the launcher reports dead (`param_server.Server`), recording
the step it found it at; at the end of each epoch the ranks agree on the surviving
workers (one gather over the survivors), which share the test set between them and
average their batch-norm statistics. Checkpoints hold every server's shard and optimiser
state, each worker's error-feedback residuals and the averaged batch-norm statistics.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from approxdist.comm.channel import get_channel
from approxdist.comm.codecs import get_codec
from approxdist.comm.link import Link
from approxdist.config.schema import Config
from approxdist.data import TensorDataset
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.models import build_model
from approxdist.param_server import PSMode, Roles, ServerRules, parse_mode, shard_by_bytes
from approxdist.param_server.server import Server
from approxdist.param_server.sharding import shard_bytes
from approxdist.param_server.wire import WireFormats
from approxdist.param_server.worker import Worker
from approxdist.topology.groups import TopologyGroups
from approxdist.trace import OPTIMIZER, RUN_BACK, RUN_FOR, SYNC, Recorder
from approxdist.trace.times import StepTimes
from approxdist.train.engine import ENGINES, StepOutcome
from approxdist.train.task import Task, task_named


class ParamServerEngine:
    """This rank as a server (`server` set) or a worker (`worker` set) of a PS run."""

    def __init__(self, model: nn.Module, roles: Roles, mode: PSMode, groups: TopologyGroups,
                 link: Link, steps_per_epoch: int, server: Server | None, worker: Worker | None,
                 rec: Recorder, shards: tuple[tuple[int, ...], ...], sizes: list[int],
                 task: Task) -> None:
        self.module, self.roles, self.mode, self.groups = model, roles, mode, groups
        self.task = task
        self.link = link
        self.server, self.worker, self.rec = server, worker, rec
        self.steps_per_epoch, self._step = steps_per_epoch, 0
        self.skipped = 0  # steps this worker skipped over the run (N+b)
        self.optimizers = [server.optimizer] if server else []
        self.feeds_inputs = self.feeds_labels = worker is not None
        self.shard = (worker.index if worker else 0, roles.workers)
        self._shards, self._sizes = shards, sizes
        self.steps_run = 0  # trainer steps this rank has taken over the run (skips included)
        #: the workers this server found dead: worker, rank, the step it found each at
        self.lost: list[dict[str, int]] = []

    # -- steps -----------------------------------------------------------------------------
    def train_step(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> StepOutcome:
        self._step += 1
        self.steps_run += 1
        last = self._step == self.steps_per_epoch
        if self.server is not None:
            t0 = time.perf_counter()
            with self.rec.span(SYNC):
                log = self.server.step(last, self.steps_per_epoch)
            self._note_losses(self.server)
            wall = time.perf_counter() - t0
            return StepOutcome(0.0, 0, 0, StepTimes(comm_s=wall, wall_s=wall),
                               record=log.record(self.server.rules.version))
        assert x is not None and y is not None and self.worker is not None
        t0 = time.perf_counter()
        with self.rec.span(RUN_FOR):
            out = self.module(x)
            loss = self.task(out, y)
        with self.rec.span(OPTIMIZER):
            self.module.zero_grad(set_to_none=True)
        with self.rec.span(RUN_BACK):
            loss.backward()
        t1 = time.perf_counter()
        with self.rec.span(SYNC):
            skip = self._push_pull(self.worker)
        t2 = time.perf_counter()
        n = self.task.predictions(y)
        return StepOutcome(float(loss.item()) * n, int(self.task.hits(out, y).item()), n,
                           StepTimes(compute_s=t1 - t0, wait_s=t2 - t1, wall_s=t2 - t0),
                           skip=skip)

    def _push_pull(self, worker: Worker) -> int:
        """Push and pull; the steps this worker skips after this one. In N+b a worker goes
        on at the step the slowest server has reached (Chen et al. 2016): a dropped worker
        skips the steps taken without it, and pushes only to the servers whose epoch is
        not over (`ServerRules.owed` counts on it)."""
        if self.mode.kind != "backup":
            worker.push_pull()
            return 0
        steps = self.steps_per_epoch
        worker.push_pull([k for k, n in enumerate(worker.updates_seen()) if n < steps])
        after = min(steps, *worker.updates_seen())
        skip = max(0, after - self._step)
        self._step += skip
        self.steps_run += skip
        self.skipped += skip
        return skip

    @torch.no_grad()
    def eval_batch(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> tuple[float, int, int]:
        if self.worker is None:
            return 0.0, 0, 0
        assert x is not None and y is not None
        out = self.module(x)
        return (float(self.task.summed_loss(out, y).item()), int(self.task.hits(out, y).item()),
                self.task.predictions(y))

    def _note_losses(self, server: Server) -> None:
        for w in server.newly_lost:
            self.lost.append({"worker": w, "rank": self.roles.worker_rank(w),
                              "step": self.steps_run,
                              "epoch": (self.steps_run - 1) // self.steps_per_epoch + 1})
        server.newly_lost.clear()

    def end_epoch(self) -> None:
        self._step = 0
        if self.mode.kind != "sync":  # asynchronous modes leave workers a step behind
            if self.server is not None:
                self.server.reply(range(self.roles.workers))
                self._note_losses(self.server)
            elif self.worker is not None:
                self.worker.pull()
        workers = self._surviving_workers()
        if self.worker is not None:  # the survivors share the test set
            self.shard = (workers.index(self.link.me), len(workers))
        self._average_buffers()

    def _surviving_workers(self) -> list[int]:
        """The workers' global ranks, as every surviving rank agrees (a collective)."""
        rows = self.groups.world.all_gather_object((self.link.me, self.worker is not None))
        return [rank for rank, is_worker in rows if is_worker]

    def _average_buffers(self) -> None:
        """Batch-norm statistics: the mean over the (surviving) workers; servers add
        zeros and count none."""
        bufs = [b for b in self.module.buffers() if b.is_floating_point()]
        if not bufs:
            return
        flat = torch.cat([*(b.reshape(-1) for b in bufs), torch.ones(1)]).double()
        if self.worker is None:
            flat.zero_()
        self.groups.world.all_reduce(flat)
        flat = flat[:-1] / flat[-1]
        at = 0
        for b in bufs:
            b.copy_(flat[at:at + b.numel()].view_as(b).to(b.dtype))
            at += b.numel()

    def link_bytes(self) -> dict[str, int]:
        return self.link.stats.as_dict(self.link.me)

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every server's shard and optimiser state and every (surviving) worker's
        error-feedback residuals, gathered on every rank (a collective); the batch-norm
        statistics (averaged at the end of the epoch: the same on every rank)."""
        mine: dict[str, Any] = {"steps": self.steps_run}
        if self.server is not None:
            mine["server"] = {"params": [p.detach().cpu().clone() for p in self.server.params],
                              "optimizer": self.server.optimizer.state_dict()}
        elif self.worker is not None and self.worker.feedback is not None:
            mine["feedback"] = (self.worker.index, self.worker.state_dict())
        gathered = self.groups.world.all_gather_object(mine)
        return {"servers": [g["server"] for g in gathered if "server" in g],
                "feedback": {str(w): f for w, f in (g["feedback"] for g in gathered
                                                     if "feedback" in g)},
                "buffers": {k: b.detach().cpu().clone() for k, b in self.module.named_buffers()},
                "steps": max(g["steps"] for g in gathered)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        servers = state["servers"]
        if len(servers) != self.roles.servers:
            raise ConfigError(f"the checkpoint holds {len(servers)} server shard(s) but this run "
                              f"has --servers {self.roles.servers}; resume with "
                              f"--servers {len(servers)}")
        if self.server is not None:
            saved = servers[self.server.index]
            with torch.no_grad():
                for p, v in zip(self.server.params, saved["params"]):
                    p.copy_(v)
            self.server.optimizer.load_state_dict(saved["optimizer"])
        if self.worker is not None and self.worker.feedback is not None:
            # a worker lost before the checkpoint has none: it starts from zero
            self.worker.load_state_dict(state.get("feedback", {}).get(str(self.worker.index), {}))
        buffers = dict(self.module.named_buffers())
        with torch.no_grad():
            for name, value in state.get("buffers", {}).items():
                buffers[name].copy_(value)
        self.steps_run = int(state.get("steps", 0))

    def start(self) -> None:
        if self.server is not None:
            self.server.start()
        else:
            assert self.worker is not None
            self.worker.pull()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ps": {"servers": self.roles.servers,
                                      "workers": self.roles.workers,
                                      "mode": self.mode.spec,
                                      "shard_bytes": shard_bytes(self._sizes, self._shards)}}
        if self.server is not None:
            rules = self.server.rules
            out["ps"].update({
                "staleness_histogram": {str(k): v for k, v in
                                        sorted(self.server.histogram.items())},
                "updates": rules.version, "dropped": rules.dropped,
                "pushes": list(rules.clocks), "lost_workers": self.lost})
        return out

    def close(self) -> None:
        self.link.close()


def build_param_server(cfg: Config, ctx: DistContext, groups: TopologyGroups, data: TensorDataset,
                       rec: Recorder) -> ParamServerEngine:
    """Servers and workers of `cfg.ps` on the world; the model from `cfg.train.seed`."""
    ps = cfg.ps
    roles = Roles(ps.servers, ps.workers)
    mode = parse_mode(ps.mode, roles.workers)
    check_backend(mode.spec, mode.any_source, ctx.backend)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(ctx.device)
    named = list(model.named_parameters())
    sizes = [p.numel() * p.element_size() for _, p in named]
    shards = shard_by_bytes(sizes, roles.servers)
    wire = WireFormats(get_codec(ps.push_codec), get_codec(ps.pull_codec),
                       get_channel(ps.push_channel) if ps.push_channel else None,
                       get_channel(ps.pull_channel) if ps.pull_channel else None)
    link = Link(ctx, cfg.comm.link or None, hook=rec.transfer_hook(), group=groups.world)
    steps = data.train_x.shape[0] // cfg.data.batch_size
    server = worker = None
    if roles.is_server(ctx.rank):
        k = roles.index(ctx.rank)
        params = [named[i][1] for i in shards[k]]
        opt = torch.optim.SGD(params, lr=cfg.optim.lr, momentum=cfg.optim.momentum,
                              weight_decay=cfg.optim.weight_decay, nesterov=cfg.optim.nesterov)
        server = Server(link, roles, k, params, opt, ServerRules(mode, roles.workers), wire,
                        ps.staleness_lr, ps.tolerate_worker_loss)
    else:
        worker = Worker(link, roles, roles.index(ctx.rank),
                        [[named[i][1] for i in s] for s in shards],
                        [[named[i][0] for i in s] for s in shards], wire, ps.error_feedback)
    return ParamServerEngine(model, roles, mode, groups, link, steps, server, worker, rec,
                             shards, sizes, task_named(data.task))


def check_backend(mode: str, any_source: bool, backend: str) -> None:
    """Refuse a mode that receives from any source on NCCL, which cannot."""
    if any_source and backend == "nccl":
        raise ConfigError(f"--ps-mode {mode} has the server take pushes in arrival order "
                          f"(receive from any source), which NCCL cannot; use --device cpu "
                          f"(gloo) or --ps-mode sync")


ENGINES.add("ps", build_param_server)
