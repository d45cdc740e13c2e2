"""Requests and handles of the link layer: one torch.distributed send or receive each.

`LinkRequest` is one request to torch.distributed (posted at once, in a batch, or later by the
netem shaper thread); `SendHandle` and `RecvHandle` are what `Link.isend` / `Link.irecv`
return. A gloo request must be waited exactly once, so `LinkRequest.wait` remembers it.
Requests go straight to the process group object (`pg.send` / `pg.recv`, what
`dist.isend` calls after its argument checks): the all-reduce fast path posts a few
per step and every microsecond of CPU counts when ranks outnumber cores (seed 001).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import torch
import torch.distributed as dist

from approxdist.comm.transfer import header_buffer, parse_header
from approxdist.errors import CommError
from approxdist.trace.transfers import TransferEvent

if TYPE_CHECKING:
    from approxdist.comm.link import Link

T = TypeVar("T")
Direction = Literal["send", "recv"]


class LinkRequest:
    """One torch.distributed request, posted now, in a batch, or later by the shaper."""

    __slots__ = ("link", "direction", "peer", "global_peer", "buf", "work", "error", "ready",
                 "start", "done")

    def __init__(self, link: Link, direction: Direction, peer: int, buf: torch.Tensor,
                 shaped: bool) -> None:
        """`peer` is a member index of the link's group; `global_peer` its global rank."""
        self.link, self.direction, self.peer, self.buf = link, direction, peer, buf
        self.global_peer = link.group.ranks[peer]
        self.work: Any = None
        self.error: BaseException | None = None
        self.ready = threading.Event() if shaped else None
        self.start = time.perf_counter() if link.hook is not None else 0.0
        self.done = False

    def p2p(self) -> dist.P2POp:
        fn = dist.isend if self.direction == "send" else dist.irecv
        return dist.P2POp(fn, self.buf, self.global_peer, self.link.group.pg, self.link.tag)

    def post(self) -> None:
        link = self.link
        try:
            group = link.group
            peer = group.backend_rank(self.peer)
            if self.direction == "send":
                self.work = group.pg.send([self.buf], peer, link.tag)
            else:
                self.work = group.pg.recv([self.buf], peer, link.tag)
        except BaseException as exc:  # noqa: BLE001 - raised in wait() on the caller's thread
            self.error = exc
        if self.ready is not None:
            self.ready.set()

    def describe(self) -> str:
        return f"rank {self.link.me}: {self.direction} of {self.buf.numel()} bytes " \
               f"{_dir(self.direction)} rank {self.global_peer}"

    def wait(self) -> torch.Tensor:
        """Wait once and return the buffer; later calls return at once (a gloo request
        must not be waited twice)."""
        if self.done:
            return self.buf
        if self.ready is not None:
            self.ready.wait()
        elif self.work is None and self.error is None:
            raise CommError(f"{self.describe()} waited on inside link.batch(); wait after "
                            f"the batch block")
        try:
            if self.error is not None:
                raise self.error
            self.work.wait()
        except CommError:
            raise
        except Exception as exc:  # noqa: BLE001 - re-raised with ranks and sizes
            raise CommError(f"{self.describe()} failed: {exc}", peer=self.global_peer) from exc
        self.done = True
        # Dropping a gloo request right after its wait can block: its buffer's destructor
        # waits for gloo's I/O thread to let go of it, and on a busy machine that thread
        # may be descheduled right after waking us (a scheduler slice, ~1 ms, per
        # message). A request dropped a few messages later finds it long released.
        self.link.retired.append(self.work)
        if self.link.hook is not None:
            self.link.hook(TransferEvent(self.direction, self.link.me, self.global_peer,
                                         self.buf.numel(), self.start, time.perf_counter()))
        return self.buf


def _dir(direction: str) -> str:
    return "to" if direction == "send" else "from"


class SendHandle:
    """A posted send; `wait()` returns once the bytes have left (the buffer may be reused)."""

    def __init__(self, ops: Sequence[LinkRequest]) -> None:
        self._ops = ops

    def wait(self) -> None:
        for op in self._ops:
            op.wait()


class RecvHandle(Generic[T]):
    """A posted receive; `wait()` returns the received value.

    `nbytes` and `shape` are None until a self-describing header gives them; then
    `buffers(nbytes, shape)` names the receive buffers of the message's parts (one per
    torch.distributed message, posted in order) and `finish(buffers, shape)` makes the
    value once all have arrived.
    """

    def __init__(self, link: Link, peer: int, nbytes: int | None, shape: torch.Size | None,
                 buffers: Callable[[int, torch.Size], list[torch.Tensor]],
                 finish: Callable[[list[torch.Tensor], torch.Size], T]) -> None:
        self.link, self.peer, self._buffers, self._finish = link, peer, buffers, finish
        self._nbytes, self._shape = nbytes, shape
        self._header: LinkRequest | None = None
        self._parts: list[LinkRequest] | None = None
        self._result: T | None = None
        self._done = False

    def _post_next(self, block: bool) -> bool:
        """Post what can be posted; True once the payload receives are posted."""
        if self._parts is not None:
            return True
        if self._nbytes is None and self._header is None:
            self._header = self.link._post("recv", self.peer, header_buffer(self.link.device))
        if self._nbytes is None:
            if not block:
                return False
            assert self._header is not None
            self._header.wait()
            self._nbytes, self._shape = parse_header(self._header.buf, self.peer)
        assert self._shape is not None
        self._parts = [self.link._post("recv", self.peer, buf)
                       for buf in self._buffers(self._nbytes, self._shape)]
        return True

    def wait(self) -> T:
        if not self._done:
            if self._parts is None:
                self.link._pump(self.peer, until=self)
            assert self._parts is not None and self._shape is not None
            self._result = self._finish([op.wait() for op in self._parts], self._shape)
            self._done = True
        return self._result  # type: ignore[return-value]
