"""A server: holds one shard of the parameters and its optimiser; serves pushes and pulls.

Each server step receives pushes (in worker order in `sync`, from whichever worker comes
first otherwise), asks `ServerRules` what to do with each, applies the averaged kept
gradients with the optimiser (the trainer sets its learning rate) and replies with the
parameters. Everything crosses a `comm.link.Link`, so codecs, channels, emulated links,
byte accounting and tracing apply to every push and pull.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from approxdist.comm.link import Link
from approxdist.errors import CommError
from approxdist.param_server.roles import Roles
from approxdist.param_server.rules import ServerRules, Verdict
from approxdist.param_server.wire import (
    VERSION_BYTES,
    WireFormats,
    flat_values,
    load_flat,
    read_version,
    version_word,
)


@dataclass
class StepLog:
    """What one server step did (the step record of metrics.jsonl)."""

    staleness: list[int] = field(default_factory=list)  # per applied gradient
    lead: list[int] = field(default_factory=list)       # per arrival
    applied: list[int] = field(default_factory=list)    # worker of each applied gradient
    dropped: list[int] = field(default_factory=list)    # worker of each dropped gradient

    def record(self, version: int) -> dict[str, object]:
        return {"staleness": self.staleness, "lead": self.lead, "applied_from": self.applied,
                "dropped_from": self.dropped, "version": version}


class Server:
    """Server `index` of `roles`, holding `params` and stepping `optimizer` on them."""

    def __init__(self, link: Link, roles: Roles, index: int, params: Sequence[nn.Parameter],
                 optimizer: torch.optim.Optimizer, rules: ServerRules, wire: WireFormats,
                 staleness_lr: bool = False) -> None:
        self.link, self.roles, self.index, self.params = link, roles, index, list(params)
        self.optimizer, self.rules, self.wire = optimizer, rules, wire
        self.staleness_lr = staleness_lr
        self.numel = sum(p.numel() for p in self.params)
        self._kept: dict[int, torch.Tensor] = {}
        #: how many applied gradients had each staleness, over the run
        self.histogram: dict[int, int] = {}

    # -- the wire --------------------------------------------------------------------------
    def _peer(self, worker: int) -> int:
        return self.link.group.member(self.roles.worker_rank(worker))

    def reply(self, workers: Sequence[int]) -> None:
        """Send this shard's version and parameters to `workers`, in order."""
        if not workers:
            return
        word = version_word(self.rules.version, self.link.device)
        flat = flat_values(self.params)
        for w in workers:
            peer = self._peer(w)
            self.link.isend_bytes(word, peer).wait()
            self.link.send(flat, peer, self.wire.pull, self.wire.pull_channel, describe=False)

    def _receive(self, worker: int | None) -> tuple[int, int, torch.Tensor]:
        """(worker, version, gradient) of the next push: from `worker`, or from any."""
        link = self.link
        try:
            if worker is None:
                peer, word = link.recv_any_bytes(VERSION_BYTES)
            else:
                peer, word = self._peer(worker), link.irecv_bytes(self._peer(worker),
                                                                    VERSION_BYTES).wait()
            rank = link.global_rank(peer)
            if self.roles.is_server(rank):
                raise CommError(f"{self.roles.describe(link.me)} got a push from "
                                f"{self.roles.describe(rank)}, which is a server")
            grad = link.recv(peer, self.numel, self.wire.push, self.wire.push_channel)
        except CommError as exc:
            raise self._lost(exc, worker) from exc
        return self.roles.index(rank), read_version(word), grad

    def _lost(self, exc: CommError, worker: int | None) -> CommError:
        """`exc` naming the worker the server was waiting for (any of them: the ones owing)."""
        if worker is None:
            owing = [w for w in range(self.roles.workers) if w not in self.rules.held]
            who = ", ".join(self.roles.describe(self.roles.worker_rank(w)) for w in owing)
            peer = self.roles.worker_rank(owing[0]) if len(owing) == 1 else exc.peer
            return CommError(f"{self.roles.describe(self.link.me)} lost a push from one of "
                             f"{who}: {str(exc).splitlines()[0]}", peer=peer)
        rank = self.roles.worker_rank(worker)
        return CommError(f"{self.roles.describe(self.link.me)} lost the push of "
                         f"{self.roles.describe(rank)}: {str(exc).splitlines()[0]}", peer=rank)

    # -- a step ----------------------------------------------------------------------------
    def start(self) -> None:
        """Every worker starts from this shard's parameters."""
        self.reply(range(self.roles.workers))

    def step(self, last_of_epoch: bool, steps: int) -> StepLog:
        """One server step; at the end of an epoch of `steps` steps, also drain the pushes
        still due (late N+b gradients) so that no worker waits past the epoch."""
        rules, log = self.rules, StepLog()
        rules.begin_step()
        order = iter(range(self.roles.workers)) if not self.rules.mode.any_source else None
        while not rules.step_done:
            self._serve(next(order) if order is not None else None, log)
        while last_of_epoch and rules.owed(steps) > 0:
            self._serve(None, log)
        if last_of_epoch:
            rules.end_epoch()
        return log

    def _serve(self, worker: int | None, log: StepLog) -> None:
        w, version, grad = self._receive(worker)
        verdict = self.rules.arrive(w, version)
        log.lead.append(verdict.lead)
        if not verdict.keep:
            log.dropped.append(w)
        else:
            self._kept[w] = grad
        if verdict.apply:
            self._apply(verdict, log)
        self.reply(verdict.replies)

    def _apply(self, verdict: Verdict, log: StepLog) -> None:
        grads = [self._kept.pop(w) for w in verdict.apply]
        mean = grads[0] if len(grads) == 1 else torch.stack(grads).mean(0)
        load_flat(self.params, mean, into_grad=True)
        stale = max(verdict.staleness)
        if self.staleness_lr and stale > 1:  # lr / staleness (Zhang et al. 2016)
            lrs = [g["lr"] for g in self.optimizer.param_groups]
            for g in self.optimizer.param_groups:
                g["lr"] = g["lr"] / stale
            self.optimizer.step()
            for g, lr in zip(self.optimizer.param_groups, lrs):
                g["lr"] = lr
        else:
            self.optimizer.step()
        for s in verdict.staleness:
            self.histogram[s] = self.histogram.get(s, 0) + 1
        log.staleness.extend(verdict.staleness)
        log.applied.extend(verdict.apply)
