"""The link layer: tensors between two ranks through codec -> channel -> netem -> torch.distributed.

Every byte that crosses the network in approxdist goes through a `Link` (docs/architecture.md,
the wires): pipeline activations and gradients, and every all-reduce of seed 001 except
`native`. One `Link` belongs to one rank (built from its `DistContext`) and carries:

* the emulated link (`netem.Shaper`, when a link spec is given): sends are released on a
  background thread when their directed link's clock allows, receives are unchanged;
* byte accounting (`link.stats`, bytes handed to torch.distributed per peer/direction);
* an optional trace hook called with a `TransferEvent` per completed transfer.

A link runs inside a `launch.group.Group` (the world by default): peers are named by
their index in that group (`link.rank` is this process's), so the same code serves the
world, a stage's replicas or a pipeline placed on any ranks. Byte counts, trace events
and error messages name *global* ranks, which is what an operator sees.

Matching: messages between two ranks are matched in posting order per direction, like
MPI with a single tag; every receive must be posted in the same order as the peer's
sends. Independent lanes (e.g. one per communication thread) need their own `Link`
with a distinct `tag` (gloo) or group lane (`Group.fork()`). Transfers are either *sized* (the receiver
passes the shape or byte count; only the payload travels) or *self-describing* (the
sender passes `describe=True`, an 80-byte shape header precedes the payload, the
receiver passes `shape=None`); both ends must agree. No reply is ever needed.

Ops posted inside `with link.batch():` go to torch.distributed together
(`batch_isend_irecv`), which NCCL needs for simultaneous exchanges; gloo posts them one
by one either way.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist

from approxdist.comm import raw
from approxdist.comm.channel import Channel
from approxdist.comm.codecs import Codec, Payload, get_codec
from approxdist.comm.codecs.framed import FramedCodec
from approxdist.comm.link_ops import Direction, LinkRequest, RecvHandle, SendHandle
from approxdist.comm.netem import LinkSpec, Shaper, parse_link
from approxdist.comm.transfer import LinkStats, shape_header
from approxdist.errors import CommError
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, world_group
from approxdist.trace.transfers import TraceHook, TransferEvent

__all__ = ["Link", "RecvHandle", "SendHandle"]

T = TypeVar("T")

#: finished gloo requests kept alive (with their buffers) until this many more finish
RETIRED_REQUESTS = 2


class Link:
    """This rank's end of every link in `group`; see the module docstring for matching rules."""

    def __init__(self, ctx: DistContext, spec: LinkSpec | str | None = None, *,
                 hook: TraceHook | None = None, group: Group | None = None, tag: int = 0,
                 shaper: Shaper | None = None) -> None:
        self.group = group if group is not None else world_group(ctx)
        if self.group.me != ctx.rank:
            raise CommError(f"a link of rank {ctx.rank} was given {self.group!r} of rank "
                            f"{self.group.me}")
        #: this process's index in `group`, and the group's size (peers are indices too)
        self.rank, self.world_size = self.group.rank, self.group.size
        self.device, self.timeout_s = ctx.device, ctx.timeout_s
        self.spec = parse_link(spec) if isinstance(spec, str) or spec is None else spec
        if self.spec is not None and ctx.backend == "nccl":
            raise CommError("link emulation (--link) posts sends from a shaper thread, which "
                            "NCCL exchanges cannot do; use --device cpu (gloo) to emulate links")
        self.hook, self.tag = hook, tag
        self.stats = LinkStats()
        if shaper is not None and (self.spec is None or shaper.spec != self.spec):
            raise CommError(f"a shared emulated wire must have this link's spec "
                            f"({self.spec.spec if self.spec else 'none'}), got {shaper.spec.spec}")
        # lanes of one rank (comm threads) share one wire: pass the first link's `shaper`
        self._owns_shaper = shaper is None
        self._shaper = shaper if shaper is not None else \
            (Shaper(self.spec) if self.spec is not None else None)
        self._pending: dict[int, collections.deque[RecvHandle[Any]]] = \
            collections.defaultdict(collections.deque)
        self._batch: list[LinkRequest] | None = None
        self._fp32 = get_codec("fp32")
        #: finished backend requests, dropped a few messages later (`LinkRequest.wait`)
        self.retired: collections.deque[Any] = collections.deque(maxlen=RETIRED_REQUESTS)

    @property
    def me(self) -> int:
        """This process's global rank."""
        return self.group.me

    def global_rank(self, peer: int) -> int:
        """The global rank of member `peer` of the link's group."""
        return self.group.ranks[peer]

    # -- posting -------------------------------------------------------------------------
    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise CommError(f"rank {self.me}: peer {peer} is not another member of "
                            f"{self.group.describe()}")

    def account(self, direction: Direction, peer: int, nbytes: int) -> None:
        """Count `nbytes` moved to or from member `peer` by a backend collective."""
        self.stats.count(direction, self.group.ranks[peer], nbytes)

    def _post(self, direction: Direction, peer: int, buf: torch.Tensor) -> LinkRequest:
        shaped = direction == "send" and self._shaper is not None
        op = LinkRequest(self, direction, peer, buf, shaped)
        self.stats.count(direction, op.global_peer, buf.numel())
        if shaped:
            self._shaper.submit(op.global_peer, buf.numel(), op.post)  # type: ignore[union-attr]
        elif self._batch is not None:
            self._batch.append(op)
        else:
            op.post()
        return op

    def _post_parts(self, peer: int, bufs: Sequence[torch.Tensor]) -> list[LinkRequest]:
        """Send `bufs` as consecutive messages, the parts of one payload: the emulated
        wire books and releases them together, as it did the payload in one piece."""
        if self._shaper is None or len(bufs) == 1:
            return [self._post("send", peer, buf) for buf in bufs]
        ops = [LinkRequest(self, "send", peer, buf, True) for buf in bufs]
        for op in ops:
            self.stats.count("send", op.global_peer, op.buf.numel())

        def post_all() -> None:
            for op in ops:
                op.post()
        self._shaper.submit(ops[0].global_peer, sum(int(b.numel()) for b in bufs), post_all)
        return ops

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Post the sends and sized receives made inside the block together."""
        outer, self._batch = self._batch, []
        try:
            yield
        finally:
            ops, self._batch = self._batch, outer
            if ops and self.device.type == "cuda":
                works = dist.batch_isend_irecv([op.p2p() for op in ops])
                for op, work in zip(ops, works):
                    op.work = work
            else:
                for op in ops:
                    op.post()

    def _pump(self, peer: int, until: RecvHandle[Any] | None) -> None:
        """Post queued receives from `peer` in order, blocking on headers up to `until`."""
        queue = self._pending[peer]
        while queue:
            head = queue[0]
            block = until is not None and (head is until or until in queue)
            if not head._post_next(block):
                return
            queue.popleft()

    # -- bytes ---------------------------------------------------------------------------
    def post_bytes(self, sends: Sequence[tuple[int, torch.Tensor]],
                   recvs: Sequence[tuple[int, int | torch.Tensor]]
                   ) -> tuple[list[Any], list[LinkRequest]]:
        """Post sized byte receives, then sends, together (the all-reduce hot path).

        Returns (receive handles, send handles); each has `wait()`, the receive's returning
        its bytes. Same matching rules as `irecv_bytes` / `isend_bytes`.
        """
        if self.device.type == "cuda":
            with self.batch():
                return self._post_bytes(sends, recvs)
        return self._post_bytes(sends, recvs)

    def _post_bytes(self, sends: Sequence[tuple[int, torch.Tensor]],
                    recvs: Sequence[tuple[int, int | torch.Tensor]]
                    ) -> tuple[list[Any], list[LinkRequest]]:
        rops: list[Any] = []
        for peer, r in recvs:
            if self._pending.get(peer):  # self-describing receives queued before it
                rops.append(self.irecv_bytes(peer, r))
                continue
            self._check_peer(peer)
            buf = r if isinstance(r, torch.Tensor) else \
                torch.empty(r, dtype=torch.uint8, device=self.device)
            rops.append(self._post("recv", peer, buf))
        sops = []
        for peer, data in sends:
            self._check_peer(peer)
            sops.append(self._post("send", peer, data))
        return rops, sops

    def isend_bytes(self, data: torch.Tensor, peer: int) -> SendHandle:
        """Send a 1-D uint8 tensor as is; the receiver must know its length."""
        self._check_peer(peer)
        return SendHandle([self._post("send", peer, data)])

    def irecv_bytes(self, peer: int, nbytes: int | torch.Tensor) -> RecvHandle[torch.Tensor]:
        """Receive `nbytes` bytes (or into the given 1-D uint8 buffer); wait() returns them."""
        self._check_peer(peer)
        buf = nbytes if isinstance(nbytes, torch.Tensor) else self._bytes(int(nbytes))
        n = int(buf.numel())
        return self._irecv(peer, n, torch.Size([n]), lambda _n, _s: [buf], lambda bufs, _: bufs[0])

    def _bytes(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.uint8, device=self.device)

    def recv_any_bytes(self, nbytes: int) -> tuple[int, torch.Tensor]:
        """Receive `nbytes` bytes from whichever member's message comes first: (member,
        bytes). Blocking. gloo only (NCCL has no receive from any source); no receive may
        be queued at the time, and the sender's next message must be of this size."""
        if self.device.type == "cuda":
            raise CommError("a receive from any source needs gloo; NCCL cannot (use "
                            "--device cpu, or a mode that receives in a fixed order)")
        if any(self._pending.values()):
            raise CommError(f"rank {self.me}: a receive from any source while receives are "
                            f"queued would take their messages")
        buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        start = time.perf_counter() if self.hook is not None else 0.0
        try:
            work = self.group.pg.recv_anysource([buf], self.tag)
            work.wait()
            source = work._source_rank()
            self.retired.append(work)
        except Exception as exc:  # noqa: BLE001 - re-raised with the rank and the group
            raise CommError(f"rank {self.me}: receive of {nbytes} bytes from any member of "
                            f"{self.group.describe()} failed: {exc}") from exc
        peer = self.group.ranks.index(self._backend_members()[source])
        self.stats.count("recv", self.group.ranks[peer], nbytes)
        if self.hook is not None:
            self.hook(TransferEvent("recv", self.me, self.group.ranks[peer], nbytes, start,
                                    time.perf_counter()))
        return peer, buf

    def _backend_members(self) -> dict[int, int]:
        """Backend rank -> global rank of every member."""
        return {self.group.backend_rank(i): r for i, r in enumerate(self.group.ranks)}

    def _irecv(self, peer: int, nbytes: int | None, shape: torch.Size | None,
               buffers: Callable[[int, torch.Size], list[torch.Tensor]],
               finish: Callable[[list[torch.Tensor], torch.Size], T]) -> RecvHandle[T]:
        handle = RecvHandle(self, peer, nbytes, shape, buffers, finish)
        queue = self._pending[peer]
        if queue or nbytes is None:
            queue.append(handle)
            self._pump(peer, until=None)
        else:
            handle._post_next(block=False)  # nothing queued before it: post at once
        return handle

    # -- tensors -------------------------------------------------------------------------
    def isend(self, x: torch.Tensor, peer: int, codec: Codec | None = None,
              channel: Channel | None = None, *, describe: bool = True) -> SendHandle:
        """Encode `x` (any shape) with `codec` (default fp32), corrupt it on `channel`, send.

        With `describe=True` an 80-byte shape header goes first and the receiver calls
        `irecv(peer, None, codec)`; with `describe=False` the receiver passes the shape.
        Exact fp32 of `raw.SPLIT_MIN_BYTES` or more travels uncopied (`comm/raw.py`): `x`
        must then stay unchanged until `wait()` returns, as for `isend_bytes`.
        """
        self._check_peer(peer)
        codec = codec or self._fp32
        exact = raw.exact(codec, channel)
        if exact and raw.splits(codec, channel, x.numel()):
            parts = raw.send_parts(cast(FramedCodec, codec), x.detach())
        elif exact:
            parts = [raw.pack(cast(FramedCodec, codec), x.detach())]
        else:
            payload = codec.encode(x.detach())
            if channel is not None:
                payload = channel.corrupt(payload, codec)
            parts = [payload.data]
        ops = []
        if describe:
            nbytes = sum(int(p.numel()) for p in parts)
            ops.append(self._post("send", peer, shape_header(nbytes, list(x.shape), self.device)))
        ops.extend(self._post_parts(peer, parts))
        return SendHandle(ops)

    def irecv(self, peer: int, shape: Sequence[int] | int | None = None,
              codec: Codec | None = None, channel: Channel | None = None
              ) -> RecvHandle[torch.Tensor]:
        """Receive one tensor; `shape=None` for a self-describing send. wait() -> fp32 tensor.

        With a `channel`, non-finite decoded values are set to 0 and counted in
        `stats.nonfinite`.
        """
        self._check_peer(peer)
        codec = codec or self._fp32
        size = None if shape is None else torch.Size([shape] if isinstance(shape, int) else shape)
        nbytes = None if size is None else codec.payload_nbytes(size.numel())
        if raw.exact(codec, channel):  # new buffers for each receive: the result is a view
            fp32 = cast(FramedCodec, codec)
            return self._irecv(peer, nbytes, size,
                               lambda n, shp: raw.recv_parts(n, shp, self.device),
                               lambda bufs, shp: raw.finish(fp32, bufs, shp))
        return self._irecv(peer, nbytes, size, lambda n, _: [self._bytes(n)],
                           lambda bufs, shp: self._decode(bufs[0], shp, codec, channel))

    def _decode(self, buf: torch.Tensor, shape: torch.Size, codec: Codec,
                channel: Channel | None) -> torch.Tensor:
        x = codec.decode(Payload(buf, shape))
        if channel is not None:
            x, bad = channel.guard(x)
            self.stats.nonfinite += bad
        return x

    def send(self, x: torch.Tensor, peer: int, codec: Codec | None = None,
             channel: Channel | None = None, *, describe: bool = True) -> None:
        self.isend(x, peer, codec, channel, describe=describe).wait()

    def recv(self, peer: int, shape: Sequence[int] | int | None = None,
             codec: Codec | None = None, channel: Channel | None = None) -> torch.Tensor:
        return self.irecv(peer, shape, codec, channel).wait()

    def book_chain(self, peer: int, nbytes: int, hops: int, since: float) -> float | None:
        """Book this rank's emulated wire to member `peer` for `hops` dependent messages of
        `nbytes` that a backend collective (gloo's ring) sent from `since` (monotonic
        clock); the time the last arrives, or None without emulation."""
        if self._shaper is None:
            return None
        return self._shaper.book_chain(self.group.ranks[peer], nbytes, hops, since)

    @property
    def shaper(self) -> Shaper | None:
        """This link's emulated wire (None without emulation), to share with `shaper=`."""
        return self._shaper

    def close(self) -> None:
        """Release held sends and stop the shaper thread (call before leaving the group).

        A link given someone else's `shaper` leaves it running: its owner closes it.
        """
        if self._shaper is not None and self._owns_shaper:
            self._shaper.close()
        self.retired.clear()
