"""A one-process replay of an asynchronous parameter server's recorded push order (the
oracle of `tests/dist/test_param_server_oracle.py`'s async, SSP and N+b cases).

A server records every push it took as `[worker, version read, version applied to]`
(None: dropped; `param_server.steplog`). The arrival order is the one thing such a run
does not fix in advance; the replay takes it and shares nothing else with the server but
the model's definition and seed, the data, the optimiser's settings and the wire's flat
layout of the parameters (`param_server.wire`). It keeps every parameter version it
makes and, for update a (the one applied to version a, giving version a + 1):

* computes each of its gradients at the version its push read, on the mini-batch of the
  worker's step: a worker's k-th push is its step k (async, SSP: every worker pushes once
  per step); in N+b a worker computes the step equal to the updates it has seen, the
  version it read (Chen et al. 2016: a dropped worker skips the steps taken without it);
* averages them in worker order and steps plain `torch.optim.SGD` with the momentum the
  delay rule gives (async, SSP: max(0, b - (W - 1) / W), W workers) and, with
  `staleness_lr`, the learning rate lr / max(1, s), s the update's largest staleness
  a - read (Zhang et al. 2016);
* on lossy wires, applies the push codec's round trip to each flat gradient a worker
  sends and the pull codec's to the flat parameters a worker computes at.

One server or, in async and SSP, several (`replay_sharded`: each server's versions of its
shard, a gradient computed at the version of every shard its worker read for that step),
over one round (epoch) or several: versions count on across rounds (a round starts from
the version the last one ended at), a worker's steps count from 0 in each, and an update
steps at the learning rate its server step recorded (`lr`, the trainer's rule), where one
is recorded.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from approxdist.comm.codecs import get_codec
from approxdist.param_server.wire import flat_grads, flat_values, load_flat

Batch = Callable[[int, int, int], tuple[torch.Tensor, torch.Tensor]]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Push:
    """One push as the server recorded it."""

    worker: int
    read: int
    at: int | None  # the version its update was applied to; None: dropped
    epoch: int = 0  # the round it arrived in
    lr: float | None = None  # the learning rate of its server step, where recorded


@dataclass(frozen=True)
class Setup:
    """What the run was asked for: mode kind (async, ssp, backup), workers, SGD's settings
    as the user gave them, the wires' codecs."""

    kind: str
    workers: int
    lr: float
    momentum: float
    decay: float
    staleness_lr: bool = False
    push: str = "fp32"
    pull: str = "fp32"

    @property
    def server_momentum(self) -> float:
        """The delay rule: gradients W - 1 updates late add (W - 1) / W momentum of their own."""
        if self.kind in ("async", "ssp"):
            return max(0.0, self.momentum - (self.workers - 1) / self.workers)
        return self.momentum


def pushes_of(records: Sequence[dict[str, Any]]) -> list[Push]:
    """Every push of the step records (a round's, or a run's from metrics.jsonl: their
    `epoch` counts from 1, their `lr` is the step's), in arrival order."""
    return [Push(int(w), int(r), None if a is None else int(a), int(rec.get("epoch", 1)) - 1,
                 rec.get("lr"))
            for rec in records for w, r, a in rec["order"]]


def steps_of(pushes: Sequence[Push], kind: str) -> list[int]:
    """The step (mini-batch index in its round) each push's gradient was computed on."""
    if kind == "backup":  # the version read, counted from the round's first
        first: dict[int, int] = {}
        for p in pushes:
            first[p.epoch] = min(first.get(p.epoch, p.read), p.read)
        return [p.read - first[p.epoch] for p in pushes]
    seen: dict[tuple[int, int], int] = {}
    out = []
    for p in pushes:
        out.append(seen.get((p.worker, p.epoch), 0))
        seen[p.worker, p.epoch] = out[-1] + 1
    return out


def replay(model: nn.Module, batch: Batch, loss_fn: LossFn, pushes: Sequence[Push],
           setup: Setup) -> dict[str, torch.Tensor]:
    """`model` (the initial weights, left untouched) trained by the updates of `pushes`
    (one server); `batch(worker, step, epoch)` is that worker's share of the step's
    mini-batch."""
    every = tuple(range(len(list(model.parameters()))))
    return replay_sharded(model, batch, loss_fn, [pushes], [every], setup)


def replay_sharded(model: nn.Module, batch: Batch, loss_fn: LossFn,
                   orders: Sequence[Sequence[Push]], shards: Sequence[Sequence[int]],
                   setup: Setup) -> dict[str, torch.Tensor]:
    """As `replay`, with the parameters sharded over servers: server k holds the
    parameters `shards[k]` (indices in `model.parameters()` order) and recorded `orders[k]`.
    A gradient is computed at every shard's version its worker read for that step (a
    worker's k-th push to each server is its step k: async and SSP)."""
    assert len(orders) == len(shards) and (len(shards) == 1 or setup.kind != "backup"), \
        "several servers replay async and SSP (an N+b worker's step is not its k-th push)"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the spawned ranks compute: the same sums in the same order
    try:
        return _Replay(model, loss_fn, orders, shards, setup).run(batch)
    finally:
        torch.set_num_threads(threads)


class _Replay:
    """Every server's parameter versions, made update by update in an order the run's
    causality allows (an update waits for the versions its pushes read)."""

    def __init__(self, model: nn.Module, loss_fn: LossFn, orders: Sequence[Sequence[Push]],
                 shards: Sequence[Sequence[int]], setup: Setup) -> None:
        self.server, self.worker = copy.deepcopy(model), copy.deepcopy(model)
        self.loss_fn, self.setup = loss_fn, setup
        held, computing = list(self.server.parameters()), list(self.worker.parameters())
        self.held = [[held[i] for i in s] for s in shards]
        self.computing = [[computing[i] for i in s] for s in shards]
        self.opts = [torch.optim.SGD(h, lr=setup.lr, momentum=setup.server_momentum,
                                     weight_decay=setup.decay) for h in self.held]
        self.push_codec, self.pull_codec = get_codec(setup.push), get_codec(setup.pull)
        self.versions = [[flat_values(h)] for h in self.held]  # [k][v]: after v updates
        self.reads: list[dict[tuple[int, int, int], int]] = []
        self.updates: list[list[list[tuple[Push, int]]]] = []  # [k][a]: update a's pushes
        for order in orders:
            steps = steps_of(order, setup.kind)
            self.reads.append({(p.worker, p.epoch, s): p.read for p, s in zip(order, steps)})
            applied = [(p, s) for p, s in zip(order, steps) if p.at is not None]
            ats = sorted({p.at for p, _ in applied if p.at is not None})
            assert ats == list(range(len(ats))), f"updates {ats} are not 0, 1, 2, ..."
            self.updates.append([sorted(((p, s) for p, s in applied if p.at == a),
                                        key=lambda ps: ps[0].worker) for a in ats])

    def run(self, batch: Batch) -> dict[str, torch.Tensor]:
        while any(len(v) <= len(u) for v, u in zip(self.versions, self.updates)):
            ready = [k for k, u in enumerate(self.updates)
                     if len(self.versions[k]) <= len(u) and self._ready(u[len(self.versions[k]) - 1])]
            assert ready, "no server's next update has the versions its pushes read"
            for k in ready:
                self._update(k, batch)
        return {n: p.detach().clone() for n, p in self.server.named_parameters()}

    def _ready(self, group: list[tuple[Push, int]]) -> bool:
        return all(reads[p.worker, p.epoch, s] < len(made)
                   for p, s in group for reads, made in zip(self.reads, self.versions))

    def _update(self, k: int, batch: Batch) -> None:
        a = len(self.versions[k]) - 1
        group = self.updates[k][a]
        assert all(p.read <= a for p, _ in group), f"update {a} uses a version not yet made"
        grads = [self._gradient(k, p, s, batch) for p, s in group]
        mean = grads[0]
        for g in grads[1:]:
            mean.add_(g)
        if len(grads) > 1:
            mean.div_(len(grads))
        stale = max(a - p.read for p, _ in group)
        base = self.setup.lr if group[0][0].lr is None else float(group[0][0].lr)
        for pg in self.opts[k].param_groups:
            pg["lr"] = base / max(1, stale) if self.setup.staleness_lr else base
        load_flat(self.held[k], mean, into_grad=True)
        self.opts[k].step()
        self.versions[k].append(flat_values(self.held[k]))

    def _gradient(self, k: int, p: Push, step: int, batch: Batch) -> torch.Tensor:
        """Server k's shard of the gradient of `p`'s worker at `step`, computed at the
        version of every shard it read, through the wires' codecs."""
        for j, computing in enumerate(self.computing):
            read = self.reads[j][p.worker, p.epoch, step]
            load_flat(computing, self.pull_codec.roundtrip(self.versions[j][read]))
        x, y = batch(p.worker, step, p.epoch)
        self.worker.zero_grad(set_to_none=True)
        self.loss_fn(self.worker(x), y).backward()
        return self.push_codec.roundtrip(flat_grads(self.computing[k]))
