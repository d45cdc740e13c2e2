"""A server: holds one shard of the parameters and its optimiser; serves pushes and pulls.

Each server step receives pushes (in `sync` the receives of every worker's push are
posted at once and read in worker order; otherwise from whichever worker comes first),
asks `ServerRules` what to do with each, applies the averaged kept gradients (a push
compressor's aggregate: `param_server.compressed`) with the optimiser (the trainer sets
its learning rate) and replies with the parameters: the replies to all workers are posted
together, and the server goes on without waiting for them to leave (`settle` waits before
its next reply or step, a reply's buffers being its own). Everything crosses a
`comm.link.Link`, so codecs, channels, emulated links, byte accounting and tracing apply
to every push and pull. Posting the pushes together and not waiting for the replies
closed most of sync PS's gap to all-reduce at W = 2: one server's serial waits were most
of it (docs/param_server.md, "What closed the W = 2 gap").

With `tolerate_loss` (`--tolerate-worker-loss`) the server takes pushes from one posted
receive per live worker instead of gloo's receive from any source, which fails for good
once a dead worker's connection is reset (`param_server.arrivals`); it waits in short
slices and reads its group's lost ranks (`Group.lost_ranks`: the launcher's loss board)
in between. A lost worker leaves the `ServerRules`, its replies are skipped, and a failed
transfer with a worker the board then lists is that loss, not an error. Fewer workers
than an update needs end the run with an error naming the lost ones.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import nn

from approxdist.comm.link import Link, RecvHandle, SendHandle
from approxdist.errors import CommError
from approxdist.param_server.arrivals import FirstArrival
from approxdist.param_server.compressed import PushDecoders
from approxdist.param_server.roles import Roles
from approxdist.param_server.rules import ServerRules, Verdict
from approxdist.param_server.steplog import StepLog
from approxdist.param_server.wire import (
    VERSION_BYTES,
    WireFormats,
    flat_values,
    load_flat,
    read_version,
    version_word,
)

#: the posted receives of one push: its version word, its gradient
_Push = tuple[RecvHandle[torch.Tensor], RecvHandle[torch.Tensor]]

#: how long a tolerant server waits for a push between two looks at the loss board
_POLL_S = 0.05


class Server:
    """Server `index` of `roles`, holding `params` (named `names`, for a push compressor's
    state and, with the run's `seed`, its streams) and stepping `optimizer` on them."""

    def __init__(self, link: Link, roles: Roles, index: int, params: Sequence[nn.Parameter],
                 optimizer: torch.optim.Optimizer, rules: ServerRules, wire: WireFormats,
                 staleness_lr: bool = False, tolerate_loss: bool = False,
                 names: Sequence[str] = (), seed: int = 0) -> None:
        self.link, self.roles, self.index, self.params = link, roles, index, list(params)
        self.optimizer, self.rules, self.wire = optimizer, rules, wire
        self.staleness_lr = staleness_lr
        self.numel = sum(p.numel() for p in self.params)
        self._kept: dict[int, torch.Tensor] = {}
        #: how many applied gradients had each staleness, over the run
        self.histogram: dict[int, int] = {}
        self.tolerate_loss = tolerate_loss
        #: a tolerant server's posted receives, one per live worker
        self._arrivals = FirstArrival(link) if tolerate_loss else None
        #: workers found dead since the engine last looked (it records the step)
        self.newly_lost: list[int] = []
        #: replies posted and not yet waited for: (worker, send handles)
        self._replies: list[tuple[int, list[SendHandle]]] = []
        #: the push compressor's copies that unpack each worker's push (None: a codec)
        names = list(names) or [str(i) for i in range(len(self.params))]
        self.decoders = PushDecoders(wire.compressor, self.params, names, roles.workers,
                                     link.device, seed) if wire.compressor else None

    # -- the wire --------------------------------------------------------------------------
    def _peer(self, worker: int) -> int:
        return self.link.group.member(self.roles.worker_rank(worker))

    def reply(self, workers: Sequence[int], log: StepLog | None = None) -> None:
        """Send this shard's version and parameters to `workers`, in order (a tolerant
        server skips the lost ones and takes in a loss found on the way into `log`)."""
        workers = [w for w in workers if w not in self.rules.lost]
        if not workers:
            return
        self.settle(log)
        word = version_word(self.rules.version, self.link.device)
        flat = flat_values(self.params)
        for w in workers:  # every reply posted at once: the workers read them side by side
            peer = self._peer(w)
            try:
                self._replies.append((w, [self.link.isend_bytes(word, peer),
                                          self.link.isend(flat, peer, self.wire.pull,
                                                          self.wire.pull_channel,
                                                          describe=False)]))
            except CommError as exc:
                self._reply_failed(w, exc, log)

    def settle(self, log: StepLog | None = None) -> None:
        """Wait for the replies still leaving. A reply's buffers are its own, so the server
        goes on as soon as it has posted them and settles them later: before its next reply,
        before it waits for the next pushes, and at the end of a round."""
        while self._replies:
            w, handles = self._replies.pop(0)
            try:
                for h in handles:
                    h.wait()
            except CommError as exc:
                self._reply_failed(w, exc, log)

    def _reply_failed(self, worker: int, exc: CommError, log: StepLog | None) -> None:
        if not self.tolerate_loss:
            raise exc
        self._confirm_lost(worker, exc, log if log is not None else StepLog())

    def _post_push(self, worker: int) -> _Push:
        """Post the receives of `worker`'s next push (its version word, its gradient)."""
        peer = self._peer(worker)
        return self.link.irecv_bytes(peer, VERSION_BYTES), self._grad_recv(peer)

    def _grad_recv(self, peer: int) -> RecvHandle[torch.Tensor]:
        """The receive of a push's gradient: in the push codec, or a compressor's bytes."""
        if self.decoders is not None:
            return self.link.irecv_bytes(peer, self.decoders.nbytes)
        return self.link.irecv(peer, self.numel, self.wire.push, self.wire.push_channel)

    def _receive(self, log: StepLog, steps: int, posted: tuple[int, _Push] | None = None
                 ) -> tuple[int, int, torch.Tensor] | None:
        """(worker, version, gradient) of the next push: from the worker whose receives are
        `posted` (sync), or from any (in an epoch of `steps` steps); None when the server
        found a worker dead meanwhile."""
        link = self.link
        grad_recv: RecvHandle[torch.Tensor] | None = None
        if posted is None:
            got = self._next_any(log, steps)
            if got is None:
                return None
            peer, word = got
        else:
            worker, (word_recv, grad_recv) = posted
            peer = self._peer(worker)
            try:
                word = word_recv.wait()
            except CommError as exc:
                raise self._lost(exc, worker) from exc
        rank = link.global_rank(peer)
        if self.roles.is_server(rank):
            raise CommError(f"{self.roles.describe(link.me)} got a push from "
                            f"{self.roles.describe(rank)}, which is a server")
        try:
            grad = (grad_recv if grad_recv is not None else self._grad_recv(peer)).wait()
        except CommError as exc:
            self._confirm_lost(self.roles.index(rank), exc, log)
            return None
        worker = self.roles.index(rank)
        if self.decoders is not None:  # in each worker's push order: its stream's order
            grad = self.decoders.unpack(worker, grad)
        return worker, read_version(word), grad

    def _next_any(self, log: StepLog, steps: int) -> tuple[int, torch.Tensor] | None:
        """(member, version word) of the next push from any worker; a tolerant server
        returns None when it found a worker dead meanwhile (`param_server.arrivals`). It
        posts receives only for pushes due this epoch, so none is left when it ends."""
        if self._arrivals is None:
            try:
                return self.link.recv_any_bytes(VERSION_BYTES)
            except CommError as exc:
                raise self._lost(exc, None) from exc
        self._arrivals.post([self._peer(w) for w in self.rules.live
                             if self.rules.owes(w, steps)], VERSION_BYTES)
        while True:
            got = self._arrivals.next(_POLL_S)
            if got is not None:
                peer, word, error = got
                if error is None:
                    assert word is not None
                    return peer, word
                self._confirm_lost(self.roles.index(self.link.global_rank(peer)), error, log)
                return None
            if self.check_losses(log):
                return None

    def check_losses(self, log: StepLog) -> bool:
        """Take in the workers the loss board lists that the rules still count on; whether
        there were any."""
        known = {self.roles.worker_rank(w) for w in self.rules.lost}
        new = sorted(r for r in self.link.group.lost_ranks() - known
                     if not self.roles.is_server(r))
        for rank in new:
            self._take_loss(self.roles.index(rank), log)
        return bool(new)

    def _take_loss(self, worker: int, log: StepLog) -> None:
        rank = self.roles.worker_rank(worker)
        log.lost.append(rank)
        self.newly_lost.append(worker)
        released = self.rules.lose(worker)
        if self._arrivals is not None:
            self._arrivals.forget(self._peer(worker))
        if self.rules.short:
            lost = ", ".join(self.roles.describe(self.roles.worker_rank(w))
                             for w in sorted(self.rules.lost))
            raise CommError(f"{self.roles.describe(self.link.me)} lost {lost}: "
                            f"{len(self.rules.live)} worker(s) left, fewer than the "
                            f"{self.rules.needed} gradient(s) each update of --ps-mode "
                            f"{self.rules.mode.spec} needs; the run cannot go on")
        self.reply(released, log)

    def _confirm_lost(self, worker: int, exc: CommError, log: StepLog) -> None:
        """A transfer with `worker` failed: its loss, once the board lists it (a tolerant
        server); otherwise, or if the board never does, the error naming it."""
        rank = self.roles.worker_rank(worker)
        deadline = time.monotonic() + self.link.timeout_s
        while self.tolerate_loss and time.monotonic() < deadline:
            if rank in self.link.group.lost_ranks():
                if worker not in self.rules.lost:
                    self._take_loss(worker, log)
                return
            time.sleep(_POLL_S)
        raise self._lost(exc, worker) from exc

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
        if self.tolerate_loss:
            self.check_losses(log)
        if not rules.mode.any_source:  # sync: one push of every worker, all received at once
            posted = [(w, self._post_push(w)) for w in range(self.roles.workers)
                      if rules.owes(w, steps)]
            self.settle(log)
            for push in posted:
                self._serve(log, steps, push)
        while not rules.step_done(steps):
            assert rules.mode.any_source, "a sync step ended short of a push"
            self._serve(log, steps)
        while last_of_epoch and rules.owed(steps) > 0:
            self._serve(log, steps)
        if last_of_epoch:
            self.settle(log)
            rules.end_epoch()
        return log

    def _serve(self, log: StepLog, steps: int, posted: tuple[int, _Push] | None = None) -> None:
        got = self._receive(log, steps, posted)
        if got is None:  # a worker was lost meanwhile: the caller looks at the rules again
            return
        w, version, grad = got
        if w in self.rules.lost:  # sent before it died, read after its loss was taken in
            return
        verdict = self.rules.arrive(w, version)
        log.arrived(w, version, verdict)
        if verdict.keep:
            self._kept[w] = grad
        if verdict.apply:
            self._apply(verdict, log)
        self.reply(verdict.replies, log)

    def _apply(self, verdict: Verdict, log: StepLog) -> None:
        grads = [self._kept.pop(w) for w in verdict.apply]
        if self.decoders is not None:
            mean = self.decoders.aggregate(grads)
        else:
            mean = grads[0]  # a received buffer, the server's own: summed into in place
            for other in grads[1:]:
                mean.add_(other)
            if len(grads) > 1:
                mean.div_(len(grads))
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
        log.updated(verdict)
