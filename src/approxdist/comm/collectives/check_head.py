"""The argument check of single-host runs: the signature rides on each pair's first message.

No extra round trip, so small calls cost nothing more than unchecked ones (`check.py`'s
handshake costs one, about 0.1-0.2 ms on loopback). The first message a rank sends to
each peer in a call is a *head*: its 200-byte `Signature` followed by at most `HEAD_CAP`
bytes of the data; anything beyond travels in a second message. The receiver posts a
head buffer of signature + `HEAD_CAP` bytes (never too short), compares the signature
with its own, raises a `CommError` naming both ranks and their values on a mismatch, and
only then posts the rest. That late posting is what stalls gloo on a real, shaped TCP
link (docs/links.md), so `AllReduce` uses this scheme only where every rank is on one
host (`check.scheme`). NCCL needs exact sizes, so there the head is the signature alone.
A rank with nothing to send or receive (length 0) swaps heads with every rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from approxdist.comm.buffers import BufferPool
from approxdist.comm.collectives.base import PeerComm, Pending, Recv, Send
from approxdist.comm.collectives.check import SIGNATURE_BYTES, Signature, SignedComm
from approxdist.comm.collectives.peers import LinkComm

#: data bytes carried by a head: one reduce segment (`wire.SEGMENT_BYTES`) plus codec headers,
#: so messages up to a segment never pay the extra round trip of a second part
HEAD_CAP = (1 << 20) + 4096


class _CheckedPending:
    """Receives of one batch: plain ones are posted; those from unchecked peers wait for the
    head, are checked, and are then posted in order (rest of the head's message first)."""

    def __init__(self, comm: HeadCheckedComm, inner: Pending, recvs: Sequence[Recv],
                 where: list[tuple[str, int]], heads: dict[int, int],
                 send_map: list[list[int]]) -> None:
        self.comm, self.inner, self.recvs, self.send_map = comm, inner, list(recvs), send_map
        self.where, self.heads = where, heads  # where[i]: ("plain", j) or ("peer", peer)
        self.late: dict[int, tuple[Pending | None, dict[int, int], dict[int, torch.Tensor]]] = {}

    def _open(self, peer: int) -> tuple[Pending | None, dict[int, int], dict[int, torch.Tensor]]:
        """Wait for `peer`'s head, check it, post the rest of its receives."""
        entry = self.late.get(peer)
        if entry is not None:
            return entry
        buf = self.inner.recv(self.heads[peer])
        self.comm.verify(peer, buf[:SIGNATURE_BYTES])
        mine = [i for i, w in enumerate(self.where) if w == ("peer", peer)]
        first = mine[0]
        target = self.recvs[first][1]
        n = int(target.numel()) if isinstance(target, torch.Tensor) else int(target)
        if isinstance(self.comm.inner, LinkComm):  # the head held min(n, cap), not the cap
            self.comm.inner.shorten_receive(peer, self.comm.cap - min(n, self.comm.cap))
        later: list[Recv] = []
        index: dict[int, int] = {}
        if n <= self.comm.cap:  # all of it came with the head: hand out the head's bytes
            whole = buf[SIGNATURE_BYTES:SIGNATURE_BYTES + n]
        else:
            whole = target if isinstance(target, torch.Tensor) else \
                torch.empty(n, dtype=torch.uint8, device=buf.device)
            k = self.comm.cap
            whole[:k].copy_(buf[SIGNATURE_BYTES:SIGNATURE_BYTES + k])
            index[first] = 0
            later.append((peer, whole[k:]))
        for i in mine[1:]:
            index[i] = len(later)
            later.append(self.recvs[i])
        entry = (self.comm.inner.start([], later) if later else None, index, {first: whole})
        self.late[peer] = entry
        return entry

    def recv(self, i: int) -> torch.Tensor:
        kind, ref = self.where[i]
        if kind == "plain":
            return self.inner.recv(ref)
        pending, index, whole = self._open(ref)
        if i in index:
            assert pending is not None
            data = pending.recv(index[i])  # the rest of the head's message, or a later one
            if i not in whole:
                return data
        return whole[i]

    def received(self) -> list[torch.Tensor]:
        return [self.recv(i) for i in range(len(self.recvs))]

    def sent(self, i: int) -> None:
        for j in self.send_map[i]:
            self.inner.sent(j)

    def finish(self) -> None:
        self.inner.finish()
        for pending, _, _ in self.late.values():
            if pending is not None:
                pending.finish()


class HeadCheckedComm(SignedComm):
    """A `PeerComm` whose first message to and from each peer carries the `Signature`."""

    def __init__(self, inner: PeerComm, signature: Signature, encoded: torch.Tensor,
                 scratch: BufferPool | None = None, names: Sequence[int] | None = None) -> None:
        super().__init__(inner, signature, encoded, scratch, names)
        self.cap = 0 if encoded.device.type == "cuda" else HEAD_CAP
        self.announced: set[int] = set()

    def start(self, sends: Sequence[Send], recvs: Sequence[Recv]) -> Pending:
        out: list[Send] = []
        send_map: list[list[int]] = []
        for peer, data in sends:
            if peer in self.announced:
                send_map.append([len(out)])
                out.append((peer, data))
                continue
            self.announced.add(peer)
            k = min(self.cap, int(data.numel()))
            send_map.append([len(out)])
            out.append((peer, self._head(peer, data[:k])))
            if data.numel() > k:
                send_map[-1].append(len(out))
                out.append((peer, data[k:]))
        posted: list[Recv] = []
        where: list[tuple[str, int]] = []
        heads: dict[int, int] = {}
        for peer, target in recvs:
            if peer in self.verified:
                where.append(("plain", len(posted)))
                posted.append((peer, target))
                continue
            where.append(("peer", peer))
            if peer not in heads:
                heads[peer] = len(posted)
                head = self.scratch.get(f"head{peer}", SIGNATURE_BYTES + self.cap, torch.uint8,
                                        self._sig.device)
                head[:SIGNATURE_BYTES].zero_()  # a short foreign message must not pass as ours
                posted.append((peer, head))
        self.verified.update(heads)
        return _CheckedPending(self, self.inner.start(out, posted), recvs, where, heads,
                               send_map)

    def _head(self, peer: int, data: torch.Tensor) -> torch.Tensor:
        """Signature + `data` in a reused buffer (a fresh large one costs page faults)."""
        n = SIGNATURE_BYTES + int(data.numel())
        head = self.scratch.get(f"send{peer}", n, torch.uint8, self._sig.device)
        head[:SIGNATURE_BYTES].copy_(self._sig)
        if n > SIGNATURE_BYTES:
            head[SIGNATURE_BYTES:].copy_(data)
        return head

    def close(self) -> None:
        """For length 0 (nothing was exchanged), swap heads with every rank to check them."""
        if self.signature.numel == 0 and not self.announced and not self.verified:
            others = [r for r in range(self.world_size) if r != self.rank]
            empty = torch.empty(0, dtype=torch.uint8, device=self._sig.device)
            pending = self.start([(p, empty) for p in others], [(p, 0) for p in others])
            pending.received()
            pending.finish()
