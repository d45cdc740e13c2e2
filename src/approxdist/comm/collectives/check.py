"""Argument check across ranks, carried by each pair's first message (no extra round trip).

gloo aborts the whole process when a message is longer than the posted receive buffer,
and accepts shorter ones silently, so mismatched lengths must be caught before a data
receive of the expected size is posted. `CheckedComm` wraps a `PeerComm`: the first
message a rank sends to each peer in a call is a *head*: its 112-byte `Signature`
(length, dtype, op, algorithm, codec, world size, segment size) followed by at most `HEAD_CAP` bytes
of the data; anything beyond travels in a second message. The receiver posts a head
buffer of signature + `HEAD_CAP` bytes (never too short), compares the signature with
its own, raises a `CommError` naming both ranks and their values on a mismatch, and
only then posts the rest. Small messages thus cost nothing extra; large ones one more
message per new peer. NCCL needs exact sizes, so there the head is the signature alone.
A rank with nothing to send or receive (length 0) swaps heads with every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from approxdist.comm.buffers import BufferPool
from approxdist.comm.collectives.base import PeerComm, Pending, Recv, Send
from approxdist.errors import CommError

_MAGIC = 0x41524447  # "ARDG"
_NAME_BYTES = 32
_INT_WORDS = 6
SIGNATURE_BYTES = _INT_WORDS * 8 + 2 * _NAME_BYTES
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class Signature:
    """What every rank must agree on for one all-reduce call."""

    numel: int
    dtype: torch.dtype
    op: str
    algorithm: str
    codec: str
    world_size: int
    segment_bytes: int = 0

    def encode(self, device: torch.device) -> torch.Tensor:
        code = _DTYPES.index(self.dtype) if self.dtype in _DTYPES else -1
        ints = torch.tensor([_MAGIC, self.numel, code, int(self.op == "mean"), self.world_size,
                             self.segment_bytes],
                            dtype=torch.int64).view(torch.uint8)
        return torch.cat([ints, _name(self.algorithm), _name(self.codec)]).to(device)

    @staticmethod
    def decode(data: torch.Tensor, peer: int) -> Signature:
        data = data.cpu()
        ints = data[:_INT_WORDS * 8].view(torch.int64).tolist()
        if ints[0] != _MAGIC:
            raise CommError(f"rank {peer} sent something else than an all-reduce signature; "
                            f"are all ranks running the same collective?")
        dtype = _DTYPES[ints[2]] if 0 <= ints[2] < len(_DTYPES) else torch.int64
        alg = _text(data[_INT_WORDS * 8:_INT_WORDS * 8 + _NAME_BYTES])
        codec = _text(data[_INT_WORDS * 8 + _NAME_BYTES:])
        return Signature(ints[1], dtype, "mean" if ints[3] else "sum", alg, codec, ints[4],
                         ints[5])


def _name(text: str) -> torch.Tensor:
    raw = text.encode()[:_NAME_BYTES].ljust(_NAME_BYTES, b"\0")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def _text(data: torch.Tensor) -> str:
    return bytes(data.tolist()).rstrip(b"\0").decode(errors="replace")


def mismatch_message(sigs: Sequence[Signature], ranks: Sequence[int]) -> str | None:
    """None if all signatures agree, else a message naming each differing field by rank."""
    labels = {"numel": "length", "dtype": "dtype", "op": "op", "algorithm": "algorithm",
              "codec": "codec", "world_size": "world size", "segment_bytes": "segment bytes"}
    parts = []
    for field, label in labels.items():
        values = [getattr(s, field) for s in sigs]
        if len(set(values)) > 1:
            groups: dict[str, list[int]] = {}
            for rank, v in zip(ranks, values):
                groups.setdefault(str(v).replace("torch.", ""), []).append(rank)
            desc = "; ".join(f"{v} on rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}"
                             for v, r in groups.items())
            parts.append(f"{label}: {desc}")
    if not parts:
        return None
    return ("all-reduce arguments differ across ranks (" + " | ".join(parts)
            + "); every rank must pass the same length, dtype, op, algorithm, codec and "
            "segment size")


#: data bytes carried by a head: one reduce segment (`wire.SEGMENT_BYTES`) plus codec headers,
#: so messages up to a segment never pay the extra round trip of a second part
HEAD_CAP = (1 << 20) + 4096


class _CheckedPending:
    """Receives of one batch: plain ones are posted; those from unchecked peers wait for the
    head, are checked, and are then posted in order (rest of the head's message first)."""

    def __init__(self, comm: CheckedComm, inner: Pending, recvs: Sequence[Recv],
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


class CheckedComm:
    """A `PeerComm` whose first message to and from each peer carries the `Signature`."""

    def __init__(self, inner: PeerComm, signature: Signature, encoded: torch.Tensor,
                 scratch: BufferPool | None = None, names: Sequence[int] | None = None) -> None:
        """`names[i]` is how errors name member i (its global rank; default i itself)."""
        self.inner, self.signature, self._sig = inner, signature, encoded
        self.names = list(names) if names is not None else list(range(inner.world_size))
        self.scratch = scratch or BufferPool()
        self.rank, self.world_size = inner.rank, inner.world_size
        self.cap = 0 if encoded.device.type == "cuda" else HEAD_CAP
        self.announced: set[int] = set()
        self.verified: set[int] = set()

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

    def verify(self, peer: int, data: torch.Tensor) -> None:
        """Raise `CommError` unless `peer`'s signature equals this rank's."""
        if torch.equal(data, self._sig):
            return
        me, them = self.names[self.rank], self.names[peer]
        theirs = Signature.decode(data, them)
        sigs = {me: self.signature, them: theirs}
        message = mismatch_message([sigs[r] for r in sorted(sigs)], sorted(sigs)) or \
            f"the all-reduce signature of rank {them} differs from this rank's ({theirs})"
        raise CommError(f"rank {me}: {message}")

    def close(self) -> None:
        """For length 0 (nothing was exchanged), swap heads with every rank to check them."""
        if self.signature.numel == 0 and not self.announced and not self.verified:
            others = [r for r in range(self.world_size) if r != self.rank]
            empty = torch.empty(0, dtype=torch.uint8, device=self._sig.device)
            pending = self.start([(p, empty) for p in others], [(p, 0) for p in others])
            pending.received()
            pending.finish()

    def native_sum(self, x: torch.Tensor) -> None:
        self.inner.native_sum(x)
