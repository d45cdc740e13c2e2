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
from approxdist.param_server import Roles, parse_mode
from approxdist.param_server.node import PSNode, check_backend
from approxdist.param_server.server import Server
from approxdist.param_server.wire import WireFormats
from approxdist.param_server.worker import Worker
from approxdist.topology.groups import MeshGroups
from approxdist.trace import OPTIMIZER, RUN_BACK, RUN_FOR, SYNC, Recorder
from approxdist.trace.times import StepTimes
from approxdist.train.engine import StepOutcome
from approxdist.train.task import Task, task_named


class ParamServerEngine:
    """This rank as a server (`server` set) or a worker (`worker` set) of a PS run; the
    sharding, the two ends and the epoch's end are `param_server.node.PSNode`'s."""

    def __init__(self, node: PSNode, groups: MeshGroups, rec: Recorder, task: Task) -> None:
        self.node, self.module, self.roles, self.mode = node, node.module, node.roles, node.mode
        self.groups, self.link, self.rec, self.task = groups, node.link, rec, task
        self.steps_per_epoch = node.steps
        self.optimizers = [node.server.optimizer] if node.server else []
        self.feeds_inputs = self.feeds_labels = node.worker is not None
        self.shard = (node.worker.index if node.worker else 0, self.roles.workers)

    @property
    def server(self) -> Server | None:
        return self.node.server

    @property
    def worker(self) -> Worker | None:
        return self.node.worker

    @property
    def skipped(self) -> int:
        """Steps this worker skipped over the run (N+b)."""
        return self.node.skipped

    # -- steps -----------------------------------------------------------------------------
    def train_step(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> StepOutcome:
        if self.server is not None:
            t0 = time.perf_counter()
            with self.rec.span(SYNC):
                log = self.node.serve_step()
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
            skip = self.node.push_pull()
        t2 = time.perf_counter()
        n = self.task.predictions(y)
        return StepOutcome(float(loss.item()) * n, int(self.task.hits(out, y).item()), n,
                           StepTimes(compute_s=t1 - t0, wait_s=t2 - t1, wall_s=t2 - t0),
                           skip=skip)

    @torch.no_grad()
    def eval_batch(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> tuple[float, int, int]:
        if self.worker is None:
            return 0.0, 0, 0
        assert x is not None and y is not None
        out = self.module(x)
        return (float(self.task.summed_loss(out, y).item()), int(self.task.hits(out, y).item()),
                self.task.predictions(y))

    def end_epoch(self) -> None:
        self.node.end_round()
        if self.worker is not None:  # the (surviving) workers share the test set
            workers = self.node.live_workers
            self.shard = (workers.index(self.link.me), len(workers))

    def link_bytes(self) -> dict[str, int]:
        return self.link.stats.as_dict(self.link.me)

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every server's shard and optimiser state and every (surviving) worker's
        error-feedback residuals, gathered on every rank (a collective); the batch-norm
        statistics (averaged at the end of the epoch: the same on every rank)."""
        mine: dict[str, Any] = {"steps": self.node.steps_run}
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
        self.node.steps_run = int(state.get("steps", 0))

    def start(self) -> None:
        self.node.start()

    def summary(self) -> dict[str, Any]:
        return {"ps": self.node.summary()}

    def close(self) -> None:
        self.link.close()


def build_param_server(cfg: Config, ctx: DistContext, groups: MeshGroups, data: TensorDataset,
                       rec: Recorder) -> ParamServerEngine:
    """Servers and workers of `cfg.ps` on the world; the model from `cfg.train.seed`."""
    ps, optim = cfg.ps, cfg.optim
    roles = Roles(ps.servers, ps.workers)
    mode = parse_mode(ps.mode, roles.workers)
    check_backend(mode.spec, mode.any_source, ctx.backend)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(ctx.device)
    wire = WireFormats(get_codec(ps.push_codec), get_codec(ps.pull_codec),
                       get_channel(ps.push_channel) if ps.push_channel else None,
                       get_channel(ps.pull_channel) if ps.pull_channel else None)
    link = Link(ctx, cfg.comm.link or None, hook=rec.transfer_hook(), group=groups.world)

    def sgd(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=optim.lr, momentum=optim.momentum,
                               weight_decay=optim.weight_decay, nesterov=optim.nesterov)

    node = PSNode(model, roles, mode, link, groups.world, wire, sgd,
                  data.train_x.shape[0] // cfg.data.batch_size,
                  error_feedback=ps.error_feedback, staleness_lr=ps.staleness_lr,
                  tolerate_worker_loss=ps.tolerate_worker_loss)
    return ParamServerEngine(node, groups, rec, task_named(data.task))
