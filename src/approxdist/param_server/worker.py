"""A worker: pushes its gradient shard by shard to the servers and pulls the parameters.

Before pushing, the worker posts the receives of every server's reply, so a server
replying never waits on a worker that is still sending (no cycle between servers and
workers). A lossy push codec may carry error feedback (`comm.error_feedback`, one
residual per server shard): what the codec dropped is added to the next push.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from approxdist.comm.error_feedback import ErrorFeedback
from approxdist.comm.link import Link, RecvHandle, SendHandle
from approxdist.comm.update_error import Sums, UpdateError, merge, sent_values
from approxdist.errors import CommError
from approxdist.param_server.compressed import PushCompressors
from approxdist.param_server.roles import Roles
from approxdist.param_server.wire import (
    VERSION_BYTES,
    WireFormats,
    flat_grads,
    load_flat,
    read_version,
    version_word,
)

#: server index, and the receives of its version word and its parameters
_Pull = tuple[int, RecvHandle[torch.Tensor], RecvHandle[torch.Tensor]]


class Worker:
    """Worker `index` of `roles`; `shards[k]` are the parameters server k holds, named
    `names[k]` (for error-feedback residuals, and with the run's `seed` for a push
    compressor's random streams)."""

    def __init__(self, link: Link, roles: Roles, index: int,
                 shards: Sequence[Sequence[nn.Parameter]], names: Sequence[Sequence[str]],
                 wire: WireFormats, error_feedback: bool = False, seed: int = 0) -> None:
        self.link, self.roles, self.index, self.wire = link, roles, index, wire
        self.shards = [list(s) for s in shards]
        self.numels = [sum(p.numel() for p in s) for s in self.shards]
        self.versions = [0] * roles.servers
        #: each server's version at the last `pull` (the start of the epoch)
        self.base = [0] * roles.servers
        self.feedback = [ErrorFeedback(_layout(s, n), device=link.device)
                         for s, n in zip(self.shards, names)] \
            if error_feedback and not wire.compressor else None
        #: the push compressors of each server's shard (None: the push codec carries them)
        self.compressors = [PushCompressors(wire.compressor, s, n, index, link.device, seed)
                            for s, n in zip(self.shards, names)] if wire.compressor else None
        self.names = [list(n) for n in names]
        #: what the push codec does to each shard's gradients, while AdaPrec measures it
        self.probes: list[UpdateError] | None = None

    def _peer(self, server: int) -> int:
        return self.link.group.member(self.roles.server_rank(server))

    def pull(self) -> None:
        """Receive every server's version and parameters (the replies to a push, or the
        start / end-of-epoch broadcast)."""
        self._finish([self._post_pull(k) for k in range(self.roles.servers)])
        self.base = list(self.versions)

    def updates_seen(self) -> list[int]:
        """Per server, the updates it had applied this epoch when it last replied."""
        return [v - b for v, b in zip(self.versions, self.base)]

    def push_pull(self, servers: Sequence[int] | None = None) -> None:
        """Push this step's gradients (in `.grad`) to `servers` (default: every server),
        then take their replies."""
        to = range(self.roles.servers) if servers is None else servers
        pulls = [self._post_pull(k) for k in to]
        sends = []
        for k in to:
            if self.compressors is not None:
                sends += self._push_compressed(k)
                continue
            flat = flat_grads(self.shards[k])
            probe = self.probes[k] if self.probes is not None else None
            exact = flat.clone() if probe is not None else flat
            residual = None
            if self.feedback is not None:
                self.feedback[k].compensate(flat, 0, self.wire.push)
                residual = self.feedback[k].flat  # flat - Q(flat) now
            if probe is not None:
                exactly = self.wire.push.lossless and residual is None
                probe.observe(0, exact, None if exactly else
                              sent_values(flat, self.wire.push, residual))
            peer = self._peer(k)
            sends.append(self.link.isend_bytes(version_word(self.versions[k], flat.device), peer))
            sends.append(self.link.isend(flat, peer, self.wire.push, self.wire.push_channel,
                                         describe=False))
        try:
            for s in sends:
                s.wait()
        except CommError as exc:
            raise self._lost(exc) from exc
        self._finish(pulls)

    def _push_compressed(self, k: int) -> list[SendHandle]:
        assert self.compressors is not None
        data, peer = self.compressors[k].message(), self._peer(k)
        return [self.link.isend_bytes(version_word(self.versions[k], data.device), peer),
                self.link.isend_bytes(data, peer)]

    def update_error(self, measure: bool) -> Sums:
        """What the push codec did to this worker's gradients while watched, per parameter
        (`comm.update_error`); `measure`: go on watching (from now, if not); False stops."""
        out = merge([p.sums() for p in self.probes or []])
        if not measure:
            self.probes = None
        elif self.probes is None:
            self.probes = [UpdateError(_layout(s, n), num, self.link.device)
                           for s, n, num in zip(self.shards, self.names, self.numels)]
        return out

    def _post_pull(self, k: int) -> _Pull:
        peer = self._peer(k)
        return k, self.link.irecv_bytes(peer, VERSION_BYTES), \
            self.link.irecv(peer, self.numels[k], self.wire.pull, self.wire.pull_channel)

    def _finish(self, pulls: list[_Pull]) -> None:
        for k, word, flat in pulls:
            try:
                self.versions[k] = read_version(word.wait())
                load_flat(self.shards[k], flat.wait())
            except CommError as exc:
                raise self._lost(exc, k) from exc

    def _lost(self, exc: CommError, server: int | None = None) -> CommError:
        rank = self.roles.server_rank(server) if server is not None else exc.peer
        who = self.roles.describe(rank) if rank is not None else "a server"
        return CommError(f"{self.roles.describe(self.link.me)} lost {who}: "
                         f"{str(exc).splitlines()[0]}", peer=rank)

    @property
    def keeps_state(self) -> bool:
        """Whether pushes leave state behind (residuals, compressors' streams)."""
        return self.feedback is not None or self.compressors is not None

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Per server shard, the error-feedback residuals or the compressors' states by
        parameter name (empty without either)."""
        return {str(k): f.state_dict() for k, f in enumerate(self._stateful())}

    def load_state_dict(self, state: Mapping[str, Mapping[str, Any]]) -> None:
        """Residuals or compressor states from `state_dict()`; a shard without any starts
        afresh."""
        for k, f in enumerate(self._stateful()):
            f.load_state_dict(state.get(str(k), {}))

    def _stateful(self) -> Sequence[ErrorFeedback | PushCompressors]:
        return self.feedback or self.compressors or []


def _layout(params: Sequence[nn.Parameter], names: Sequence[str]) -> list[tuple[str, int, int]]:
    out, at = [], 0
    for p, name in zip(params, names):
        out.append((name, at, p.numel()))
        at += p.numel()
    return out
