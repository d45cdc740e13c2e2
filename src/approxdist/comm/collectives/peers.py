"""`PeerComm`s on real ranks: over the link layer, and renumbered subgroups for folding (seed 001).

`LinkComm` posts each batch through one `Link` (so netem, byte accounting and tracing
apply) and waits with the link's timeout. `native_sum` is `dist.all_reduce`; its bytes are
counted as gloo's ring moves them (2(N-1) messages of M/N bytes to the ring neighbour),
and as it cannot be shaped packet by packet, with an emulated link it is held until the
time those messages would need on that link, booked on the rank's one emulated wire
(`Link.book_chain`), so concurrent calls from several communication threads queue
behind each other and behind shaped messages instead of each getting the whole bandwidth.

`SubComm` renumbers a subset of ranks 0..k-1, which is how folded algorithms run their
power-of-two core.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from approxdist.comm.collectives.base import PeerComm, Pending, Recv, Send
from approxdist.comm.link import Link


class _LinkPending:
    def __init__(self, recvs: list[Any], sends: list[Any]) -> None:
        self._recvs, self._sends = recvs, sends

    def recv(self, i: int) -> torch.Tensor:
        return self._recvs[i].wait()

    def received(self) -> list[torch.Tensor]:
        return [h.wait() for h in self._recvs]

    def sent(self, i: int) -> None:
        self._sends[i].wait()

    def finish(self) -> None:
        for h in self._sends:
            h.wait()


class LinkComm:
    """A `PeerComm` over this rank's `Link`: ranks are member indices of the link's group."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.rank, self.world_size = link.rank, link.world_size

    def start(self, sends: Sequence[Send], recvs: Sequence[Recv]) -> Pending:
        return _LinkPending(*self.link.post_bytes(sends, recvs))

    def shorten_receive(self, peer: int, nbytes: int) -> None:
        """Member `peer`'s message was `nbytes` shorter than the buffer it was received in:
        the link counts what arrived, not the room."""
        self.link.stats.shorten_receive(self.link.group.ranks[peer], nbytes)

    def native_sum(self, x: torch.Tensor) -> None:
        if self.world_size == 1:
            return
        start = time.monotonic()
        dist.all_reduce(x, group=self.link.group.pg)
        n, hops = self.world_size, 2 * (self.world_size - 1)
        chunk = x.numel() * x.element_size() // n
        right, left = (self.rank + 1) % n, (self.rank - 1) % n
        for _ in range(hops):  # what gloo's ring moves, counted like our own messages
            self.link.account("send", right, chunk)
            self.link.account("recv", left, chunk)
        done = self.link.book_chain(right, chunk, hops, start)
        if done is not None:
            time.sleep(max(0.0, done - time.monotonic()))


class SubComm:
    """Ranks `members[0..k-1]` of `comm`, renumbered 0..k-1 (this rank must be a member)."""

    def __init__(self, comm: PeerComm, members: Sequence[int]) -> None:
        self.comm, self.members = comm, list(members)
        self.rank, self.world_size = self.members.index(comm.rank), len(self.members)

    def start(self, sends: Sequence[Send], recvs: Sequence[Recv]) -> Pending:
        m = self.members
        return self.comm.start([(m[p], d) for p, d in sends], [(m[p], r) for p, r in recvs])

    def native_sum(self, x: torch.Tensor) -> None:
        raise NotImplementedError("native_sum runs on a link's whole group only")
