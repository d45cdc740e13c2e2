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

One server, over one round (epoch) or several: versions count on across rounds (a round
starts from the version the last one ended at), a worker's steps count from 0 in each,
and an update steps at the learning rate its server step recorded (`lr`, the trainer's
rule), where one is recorded.
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
    """`model` (the initial weights, left untouched) trained by the updates of `pushes`;
    `batch(worker, step, epoch)` is that worker's share of the step's mini-batch."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the spawned ranks compute: the same sums in the same order
    try:
        return _replay(model, batch, loss_fn, pushes, setup)
    finally:
        torch.set_num_threads(threads)


def _replay(model: nn.Module, batch: Batch, loss_fn: LossFn, pushes: Sequence[Push],
            setup: Setup) -> dict[str, torch.Tensor]:
    server, worker = copy.deepcopy(model), copy.deepcopy(model)
    opt = torch.optim.SGD(server.parameters(), lr=setup.lr, momentum=setup.server_momentum,
                          weight_decay=setup.decay)
    push_codec, pull_codec = get_codec(setup.push), get_codec(setup.pull)
    held, computing = list(server.parameters()), list(worker.parameters())
    versions = [flat_values(held)]  # versions[v]: the parameters after v updates
    steps = steps_of(pushes, setup.kind)
    applied = [(p, s) for p, s in zip(pushes, steps) if p.at is not None]
    updates = sorted({p.at for p, _ in applied if p.at is not None})
    assert updates == list(range(len(updates))), f"updates {updates} are not 0, 1, 2, ..."
    for a in updates:
        group = sorted(((p, s) for p, s in applied if p.at == a), key=lambda ps: ps[0].worker)
        assert all(p.read <= a for p, _ in group), f"update {a} uses a version not yet made"
        grads = []
        for p, s in group:
            load_flat(computing, pull_codec.roundtrip(versions[p.read]))
            x, y = batch(p.worker, s, p.epoch)
            worker.zero_grad(set_to_none=True)
            loss_fn(worker(x), y).backward()
            grads.append(push_codec.roundtrip(flat_grads(computing)))
        mean = grads[0]
        for g in grads[1:]:
            mean.add_(g)
        if len(grads) > 1:
            mean.div_(len(grads))
        stale = max(a - p.read for p, _ in group)
        base = setup.lr if group[0][0].lr is None else float(group[0][0].lr)
        lr = base / max(1, stale) if setup.staleness_lr else base
        for pg in opt.param_groups:
            pg["lr"] = lr
        load_flat(held, mean, into_grad=True)
        opt.step()
        versions.append(flat_values(held))
    return {n: p.detach().clone() for n, p in server.named_parameters()}
