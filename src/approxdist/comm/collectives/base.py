"""The point-to-point interface every all-reduce algorithm is written against (seed 001).

An algorithm sees a `PeerComm`: this rank's index, the world size, and `start(sends,
recvs)` which posts a batch of byte messages at once and returns a `Pending`. The same
algorithm code runs on the real link layer (`peers.LinkComm`) and on an in-process world
of threads (`sim.SimComm`), so its logic is unit-testable without sockets.

Messages are 1-D uint8 tensors. A receive names its peer and either a byte count or a
buffer to fill. Both ends always know a message's size (all-reduce sizes follow from
the length, the world size and the codec), and zero-byte messages are never posted.
Messages between two ranks match in posting order; an algorithm waits for every
receive of a batch before it starts another batch that receives from the same peer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

#: a receive: (peer, byte count) or (peer, uint8 buffer to fill)
Recv = tuple[int, "int | torch.Tensor"]
Send = tuple[int, torch.Tensor]


class Pending(Protocol):
    """A posted batch of messages."""

    def recv(self, i: int) -> torch.Tensor:
        """Wait for receive `i` (in the order asked for) and return its bytes."""

    def received(self) -> list[torch.Tensor]:
        """Wait for all receives; their bytes in the order they were asked for."""

    def sent(self, i: int) -> None:
        """Wait for send `i` (its buffer may then be changed)."""

    def finish(self) -> None:
        """Wait for the sends (their buffers may then be changed)."""


class PeerComm(Protocol):
    """What an algorithm may do: post batches of byte messages, or call the native op."""

    rank: int
    world_size: int

    def start(self, sends: Sequence[Send], recvs: Sequence[Recv]) -> Pending:
        """Post all `sends` and `recvs` together (receives first) and return at once."""

    def native_sum(self, x: torch.Tensor) -> None:
        """Sum `x` in place over all ranks with the backend's own all-reduce."""


class OnComm:
    """A part that runs over one `PeerComm` (`Wire`, `Collective`): its members are the comm's."""

    comm: PeerComm

    @property
    def world_size(self) -> int:
        """Members taking part (each call runs over all of them)."""
        return self.comm.world_size

    @property
    def rank(self) -> int:
        """This process's index among the members."""
        return self.comm.rank


def bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous ranges covering [0, n) whose sizes differ by at most one.

    Part i is [i*n // parts, (i+1)*n // parts); with n < parts some parts are empty.
    """
    return [(i * n // parts, (i + 1) * n // parts) for i in range(parts)]


def segment_count(numel: int, segment_bytes: int) -> int:
    """Pieces a message of `numel` fp32 values moves in: ceil(4 numel / segment_bytes), >= 1."""
    return max(1, -(-numel * 4 // segment_bytes))


def largest_power_of_two(n: int) -> int:
    """The largest power of two <= n (n >= 1)."""
    return 1 << (n.bit_length() - 1)


def ceil_log2(n: int) -> int:
    """Smallest k with 2**k >= n (n >= 1)."""
    return (n - 1).bit_length()
