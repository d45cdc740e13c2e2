"""Argument check across ranks: a signature handshake with each peer before its data.

gloo aborts the whole process when a message is longer than the posted receive buffer,
and accepts shorter ones silently, so a rank must not send data to a peer whose
arguments differ from its own. `CheckedComm` wraps a `PeerComm`. On first contact with a
peer in a call (a batch that sends to it or receives from it) a rank posts the receive
of the peer's 200-byte `Signature` (the collective, length, shape, dtype, op, root,
algorithm, codec, world size, segment size) and the batch's data receives, then sends
the peer its own; data *sends* to a peer wait until its signature has arrived and
equals this rank's, and so does taking a received message. A mismatch raises a
`CommError` naming both ranks and their values, before any data has gone to the
mismatched peer (so no receive overruns). Every collective of this package (all-reduce,
all-gather, reduce-scatter, broadcast) signs its calls this way.

The exchange is symmetric over the call's peers: a one-way step (BRB's reduce, the
fold's first send) still has the receiver send its signature to the sender, which is
what the sender waits for. Every receive is posted before the data it takes can leave,
which a real TCP link needs: the earlier scheme (the signature at the head of the first
data message, the rest of the receives posted once it was checked) let later segments
reach the receiver before their receives existed, and gloo's pair stalled on a shaped
link (docs/links.md: a 4 MB BRD at 100 Mbit/s took 610 ms instead of 345). Cost: one
200-byte message each way per new peer, and a sender waits for its receiver to reach
the call. A rank with nothing to send or receive (length 0) swaps signatures with
every rank.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from approxdist.comm.buffers import BufferPool
from approxdist.comm.collectives.base import PeerComm, Pending, Recv, Send
from approxdist.errors import CommError, SpecError

_MAGIC = 0x41524447  # "ARDG"
_NAME_BYTES = 32
#: dimensions of a shape the signature carries (a longer shape's tail is folded into the last)
MAX_DIMS = 8
_INT_WORDS = 9 + MAX_DIMS
SIGNATURE_BYTES = _INT_WORDS * 8 + 2 * _NAME_BYTES
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.uint8)
#: the collectives that sign their calls (the code travels; a name it cannot read is "?")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "broadcast")
#: per collective, the fields its members must agree on, as the error lists them
_AGREE = {
    "all-reduce": ("numel", "dtype", "op", "algorithm", "codec", "world_size", "segment_bytes"),
    "all-gather": ("shape", "dtype", "algorithm", "codec", "world_size", "segment_bytes"),
    "reduce-scatter": ("shape", "dtype", "op", "algorithm", "codec", "world_size",
                       "segment_bytes"),
    "broadcast": ("shape", "dtype", "root", "algorithm", "codec", "world_size", "segment_bytes"),
}
_LABELS = {"collective": "collective", "numel": "length", "shape": "shape", "dtype": "dtype",
           "op": "op", "root": "root", "algorithm": "algorithm", "codec": "codec",
           "world_size": "world size", "segment_bytes": "segment bytes"}


@dataclass(frozen=True)
class Signature:
    """What every member must agree on for one collective call (`_AGREE` lists which
    fields each collective compares; the all-reduce leaves `shape` empty and `root` 0)."""

    numel: int
    dtype: torch.dtype
    op: str
    algorithm: str
    codec: str
    world_size: int
    segment_bytes: int = 0
    collective: str = "all-reduce"
    shape: tuple[int, ...] = ()
    root: int = 0

    def encode(self, device: torch.device) -> torch.Tensor:
        code = _DTYPES.index(self.dtype) if self.dtype in _DTYPES else -1
        kind = COLLECTIVES.index(self.collective) if self.collective in COLLECTIVES else -1
        dims = list(self.shape[:MAX_DIMS])
        if len(self.shape) > MAX_DIMS:
            dims[-1] = math.prod(self.shape[MAX_DIMS - 1:])
        ints = torch.tensor([_MAGIC, self.numel, code, int(self.op == "mean"), self.world_size,
                             self.segment_bytes, kind, self.root, len(self.shape),
                             *dims, *[0] * (MAX_DIMS - len(dims))],
                            dtype=torch.int64).view(torch.uint8)
        return torch.cat([ints, _name(self.algorithm), _name(self.codec)]).to(device)

    @staticmethod
    def decode(data: torch.Tensor, peer: int) -> Signature:
        data = data.cpu()
        ints = data[:_INT_WORDS * 8].view(torch.int64).tolist()
        if ints[0] != _MAGIC:
            raise CommError(f"rank {peer} sent something else than a collective's signature; "
                            f"are all ranks running the same collective?")
        dtype = _DTYPES[ints[2]] if 0 <= ints[2] < len(_DTYPES) else torch.int64
        kind = COLLECTIVES[ints[6]] if 0 <= ints[6] < len(COLLECTIVES) else "?"
        ndim = max(0, ints[8])
        shape = tuple(ints[9:9 + min(ndim, MAX_DIMS)]) + (1,) * max(0, ndim - MAX_DIMS)
        alg = _text(data[_INT_WORDS * 8:_INT_WORDS * 8 + _NAME_BYTES])
        codec = _text(data[_INT_WORDS * 8 + _NAME_BYTES:])
        return Signature(ints[1], dtype, "mean" if ints[3] else "sum", alg, codec, ints[4],
                         ints[5], kind, shape, ints[7])


def _name(text: str) -> torch.Tensor:
    raw = text.encode()[:_NAME_BYTES].ljust(_NAME_BYTES, b"\0")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def _text(data: torch.Tensor) -> str:
    return bytes(data.tolist()).rstrip(b"\0").decode(errors="replace")


def _show(value: object) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(map(str, value)) + ")"
    return str(value).replace("torch.", "")


def mismatch_message(sigs: Sequence[Signature], ranks: Sequence[int]) -> str | None:
    """None if all signatures agree, else a message naming each differing field by rank."""
    kinds = list(dict.fromkeys(s.collective for s in sigs))
    fields = ["collective"] if len(kinds) > 1 else []
    fields += list(dict.fromkeys(f for k in kinds for f in _AGREE.get(k, _AGREE["all-reduce"])))
    parts = []
    for field in fields:
        values = [getattr(s, field) for s in sigs]
        if len(set(values)) > 1:
            groups: dict[str, list[int]] = {}
            for rank, v in zip(ranks, values):
                groups.setdefault(_show(v), []).append(rank)
            desc = "; ".join(f"{v} on rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}"
                             for v, r in groups.items())
            parts.append(f"{_LABELS[field]}: {desc}")
    if not parts:
        return None
    kind = kinds[0] if len(kinds) == 1 else "collective"
    agree = [_LABELS[f] if f != "segment_bytes" else "segment size" for f in fields
             if f not in ("collective", "world_size")]
    return (f"{kind} arguments differ across ranks (" + " | ".join(parts)
            + f"); every rank must pass the same {', '.join(agree[:-1])} and {agree[-1]}")


class SignedComm:
    """What both check schemes share: the wrapped `PeerComm`, this rank's `Signature` (and
    its bytes), how errors name the members, and the comparison with a peer's."""

    def __init__(self, inner: PeerComm, signature: Signature, encoded: torch.Tensor,
                 scratch: BufferPool | None = None, names: Sequence[int] | None = None) -> None:
        """`names[i]` is how errors name member i (its global rank; default i itself)."""
        self.inner, self.signature, self._sig = inner, signature, encoded
        self.names = list(names) if names is not None else list(range(inner.world_size))
        self.scratch = scratch or BufferPool()
        self.rank, self.world_size = inner.rank, inner.world_size
        self.verified: set[int] = set()

    def verify(self, peer: int, data: torch.Tensor) -> None:
        """Raise `CommError` unless `peer`'s signature bytes `data` equal this rank's."""
        if torch.equal(data, self._sig):
            return
        me, them = self.names[self.rank], self.names[peer]
        theirs = Signature.decode(data, them)
        sigs = {me: self.signature, them: theirs}
        message = mismatch_message([sigs[r] for r in sorted(sigs)], sorted(sigs)) or \
            f"the signature of rank {them} differs from this rank's ({theirs})"
        raise CommError(f"rank {me}: {message}")

    def native_sum(self, x: torch.Tensor) -> None:
        self.inner.native_sum(x)


#: how `AllReduce(check=...)` checks: the signature on each pair's first message
#: (`check_head.py`, no extra round trip) or swapped before data (this module)
SCHEMES = ("auto", "head", "handshake")


def scheme(check: bool | str, environ: Mapping[str, str] | None = None) -> str | None:
    """The check `AllReduce(check=...)` runs: None (off), "head" or "handshake". `True` /
    "auto": the handshake where the ranks span hosts (torchrun's LOCAL_WORLD_SIZE below
    WORLD_SIZE: the late receives of the head scheme stall gloo on a real TCP link), the
    head scheme on one host, where the handshake's round trip would be pure cost. Every
    rank reads the same two numbers, so all choose alike."""
    if check is False:
        return None
    if check is True or check == "auto":
        env = os.environ if environ is None else environ
        world = int(env.get("WORLD_SIZE", "1") or 1)
        local = int(env.get("LOCAL_WORLD_SIZE", str(world)) or world)
        return "handshake" if local < world else "head"
    if check in ("head", "handshake"):
        return str(check)
    raise SpecError(f"all-reduce check = {check!r} is not one of True, False, "
                    f"{', '.join(map(repr, SCHEMES))}")


class _CheckedPending:
    """A batch posted through `CheckedComm`: receives are posted, sends maybe still held."""

    def __init__(self, comm: CheckedComm, recvs: Pending | None, first: int,
                 recv_peers: list[int], sends: Pending | None) -> None:
        """Receive i is receive `first + i` of `recvs` (after the batch's signatures)."""
        self.comm, self.recvs, self.first, self.sends = comm, recvs, first, sends
        self.recv_peers = recv_peers

    def recv(self, i: int) -> torch.Tensor:
        self.comm.wait_signature(self.recv_peers[i])
        assert self.recvs is not None
        return self.recvs.recv(self.first + i)

    def received(self) -> list[torch.Tensor]:
        return [self.recv(i) for i in range(len(self.recv_peers))]

    def sent(self, i: int) -> None:
        assert self.sends is not None
        self.sends.sent(i)

    def finish(self) -> None:
        if self.sends is not None:
            self.sends.finish()


class CheckedComm(SignedComm):
    """A `PeerComm` that swaps the `Signature` with each peer before data goes to it."""

    def __init__(self, inner: PeerComm, signature: Signature, encoded: torch.Tensor,
                 scratch: BufferPool | None = None, names: Sequence[int] | None = None) -> None:
        super().__init__(inner, signature, encoded, scratch, names)
        self._waiting: dict[int, tuple[Pending, int]] = {}  # peer -> its signature's receive
        self._exchanges: list[Pending] = []

    def start(self, sends: Sequence[Send], recvs: Sequence[Recv]) -> Pending:
        new = sorted({p for p, _ in [*sends, *recvs]} - self.verified - set(self._waiting))
        held = [p for p, _ in sends if p in self._waiting or p in new]
        peers = [p for p, _ in recvs]
        if not held and not new:
            both = self.inner.start(sends, recvs)
            return _CheckedPending(self, both, 0, peers, both)
        posted = self.contact(new, recvs)  # every receive is up before our signature leaves
        for peer in held:
            self.wait_signature(peer)
        return _CheckedPending(self, posted, len(new), peers,
                               self.inner.start(sends, []) if sends else None)

    def contact(self, new: Sequence[int], recvs: Sequence[Recv] = ()) -> Pending | None:
        """Post the receives of the signatures of `new` peers (met for the first time), then
        `recvs`, then send them this rank's signature: they send data only once they have
        it, so nothing of theirs arrives before its receive is posted."""
        bufs = [self.scratch.get(f"sig{p}", SIGNATURE_BYTES, torch.uint8, self._sig.device)
                for p in new]
        for buf in bufs:
            buf.zero_()  # a short foreign message must not pass as ours
        if not new and not recvs:
            return None
        # one batch: gloo posts its receives before its sends
        posted = self.inner.start([(p, self._sig) for p in new], [*zip(new, bufs), *recvs])
        self._waiting.update((p, (posted, i)) for i, p in enumerate(new))
        if new:
            self._exchanges.append(posted)
        return posted

    def wait_signature(self, peer: int) -> None:
        """Wait for `peer`'s signature (once) and raise `CommError` unless it equals ours."""
        entry = self._waiting.pop(peer, None)
        if entry is not None:
            pending, i = entry
            self.verify(peer, pending.recv(i))
            self.verified.add(peer)


    def close(self) -> None:
        """Check every signature still in flight and finish the exchanges; with length 0
        (nothing was exchanged) swap signatures with every rank first."""
        if self.signature.numel == 0 and not self._exchanges:
            self.contact([r for r in range(self.world_size) if r != self.rank])
        for peer in sorted(self._waiting):
            self.wait_signature(peer)
        for pending in self._exchanges:
            pending.finish()
        self._exchanges.clear()
