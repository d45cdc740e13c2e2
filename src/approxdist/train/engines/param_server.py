"""Parameter-server training (seed 003): servers hold the parameter shards and the
optimiser, workers compute gradients on their share of every global batch.

A thin adapter over the public `approxdist.ParameterServer` (the class a user's own loop
runs), built with `ParameterServer.from_config` on the world.

Ranks 0..S-1 are servers, S..S+W-1 workers (`param_server.Roles`). The trainer sets the
learning rate on the servers' optimisers (a worker has none); in async and SSP their
momentum is lowered for the gradients' delay (the delay rule, named in one line before the
run starts). A worker's step is forward,
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

from approxdist.api.param_server import ParameterServer
from approxdist.comm.update_error import Sums
from approxdist.config.schema import Config
from approxdist.data import TensorDataset
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.topology.groups import MeshGroups
from approxdist.trace import Recorder
from approxdist.trace.times import StepTimes
from approxdist.train import log
from approxdist.train.engine import StepOutcome, seeded_model
from approxdist.train.optim import sgd_over
from approxdist.train.task import Task, task_named


class ParamServerEngine:
    """This rank as a server or a worker of a `ParameterServer`."""

    def __init__(self, ps: ParameterServer, task: Task) -> None:
        self.ps, self.module, self.task = ps, ps.module, task
        self.optimizers = [ps.optimizer] if ps.optimizer is not None else []
        self.feeds_inputs = self.feeds_labels = not ps.is_server
        self.shard = (0 if ps.is_server else ps.index, ps.roles.workers)

    def train_step(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> StepOutcome:
        if self.ps.is_server:
            t0 = time.perf_counter()
            record = self.ps.serve_step()
            wall = time.perf_counter() - t0
            return StepOutcome(0.0, 0, 0, StepTimes(comm_s=wall, wall_s=wall), record=record)
        assert x is not None and y is not None
        done = self.ps.worker_step(x, y)
        n = self.task.predictions(y)
        return StepOutcome(float(done.loss) * n, int(self.task.hits(done.output, y).item()), n,
                           done.times, skip=done.skip)

    @torch.no_grad()
    def score_batch(self, x: torch.Tensor | None, y: torch.Tensor | None,
                    batch_size: int) -> tuple[float, int, int]:
        """(the true class's probability summed, correct, predictions) of a worker's share
        of one batch (AdaPrec's signal); zeros on a server."""
        if self.ps.is_server:
            return 0.0, 0, 0
        assert x is not None and y is not None
        return self.task.score(self.module(x), y)

    def local_state(self) -> dict[str, Any]:
        return self.ps.local_state()

    def load_local_state(self, state: Mapping[str, Any]) -> None:
        self.ps.load_local_state(state)

    def set_wire(self, name: str, codec: str, rules: tuple[str, ...] = ()) -> None:
        """Switch the pushes' codec on every rank (AdaPrec); the pulls are not switched."""
        if name != "push" or rules:
            raise ConfigError(f"a parameter server switches its pushes' codec (wire 'push', "
                              f"one codec per shard), not wire {name!r}"
                              + (" or per-parameter rules" if rules else ""))
        self.ps.set_push_codec(codec)

    def update_error(self, measure: bool) -> Sums:
        """The push codec's error on a worker's gradients; nothing on a server."""
        worker = self.ps.worker
        return worker.update_error(measure) if worker is not None else {}

    @torch.no_grad()
    def eval_batch(self, x: torch.Tensor | None, y: torch.Tensor | None,
                   batch_size: int) -> tuple[float, int, int]:
        if self.ps.is_server:
            return 0.0, 0, 0
        assert x is not None and y is not None
        return self.task.evaluate(self.module(x), y)

    def end_epoch(self) -> None:
        self.ps.end_round()
        if not self.ps.is_server:  # the (surviving) workers share the test set
            workers = self.ps.live_workers
            self.shard = (workers.index(self.ps.link.me), len(workers))

    def link_bytes(self) -> dict[str, int]:
        return self.ps.link_bytes()

    def state_dict(self) -> dict[str, Any]:
        return self.ps.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.ps.load_state_dict(state)

    def start(self) -> None:
        """The servers sent their parameters when the `ParameterServer` was built."""

    def wires(self) -> dict[str, str]:
        """The run's two wires and the codecs in force (a worker sends pushes, a server
        pulls; both ends decode with the same codec)."""
        return {"push": self.ps.wire.push_spec, "pull": self.ps.wire.pull.spec}

    def summary(self) -> dict[str, Any]:
        return {"ps": self.ps.summary()}

    def close(self) -> None:
        self.ps.close()


def build_param_server(cfg: Config, ctx: DistContext, groups: MeshGroups, data: TensorDataset,
                       rec: Recorder) -> ParamServerEngine:
    """Servers and workers of `cfg.ps` on the world; the model from `cfg.train.seed`."""
    model = seeded_model(cfg, data, ctx)
    task = task_named(data.task)

    def sgd(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return sgd_over(params, cfg.optim)

    ps = ParameterServer.from_config(model, ps=cfg.ps, push=cfg.wire.push, pull=cfg.wire.pull,
                                     optimizer=sgd,
                                     steps=data.train_x.shape[0] // cfg.data.batch_size,
                                     group=groups.world, link=cfg.comm.link, loss_fn=task,
                                     recorder=rec, delay_rule=cfg.optim.delay_rule,
                                     seed=cfg.train.seed)
    log.notice(ctx, ps.delay_line)
    return ParamServerEngine(ps, task)
