"""Pieces of the link layer: byte accounting and the shape header (seeds 000, 001).

* `LinkStats` counts every message and the exact bytes handed to torch.distributed, per
  (peer, direction): `stats.sent[peer]`, `stats.received[peer]`.
* The shape header is a fixed 80-byte message (10 int64 words) sent before a payload
  whose receiver does not know the shape: magic, payload bytes, ndim, up to 7 dims.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from approxdist.errors import CommError

SHAPE_WORDS = 10
MAX_NDIM = SHAPE_WORDS - 3
_MAGIC = 0x41445348  # "ADSH"


@dataclass
class LinkStats:
    """Messages and bytes per peer and direction, as handed to torch.distributed."""

    sent: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    received: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    messages_sent: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    messages_received: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    nonfinite: int = 0

    def count(self, direction: str, peer: int, nbytes: int) -> None:
        if direction == "send":
            self.sent[peer] += nbytes
            self.messages_sent[peer] += 1
        else:
            self.received[peer] += nbytes
            self.messages_received[peer] += 1

    @property
    def bytes_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def bytes_received(self) -> int:
        return sum(self.received.values())

    def shorten_receive(self, peer: int, nbytes: int) -> None:
        """A receive posted with room for more than arrived: `nbytes` fewer came from `peer`
        (a head buffer sized for the largest head, `collectives/check_head.py`)."""
        self.received[peer] -= nbytes

    def as_dict(self, rank: int) -> dict[str, int]:
        """`{"0->1": bytes, "1->0": bytes, ...}` for this rank's links (JSON-ready)."""
        out = {f"{rank}->{p}": n for p, n in sorted(self.sent.items())}
        out.update({f"{p}->{rank}": n for p, n in sorted(self.received.items())})
        return out

    def reset(self) -> None:
        for d in (self.sent, self.received, self.messages_sent, self.messages_received):
            d.clear()
        self.nonfinite = 0


def shape_header(nbytes: int, shape: Sequence[int], device: torch.device) -> torch.Tensor:
    """The 80-byte header announcing a payload of `nbytes` decoding to `shape`."""
    if len(shape) > MAX_NDIM:
        raise CommError(f"cannot send a tensor with {len(shape)} dims over a link; at most "
                        f"{MAX_NDIM} (reshape it first)")
    words = [_MAGIC, nbytes, len(shape), *shape] + [0] * (MAX_NDIM - len(shape))
    return torch.tensor(words, dtype=torch.int64).to(device).view(torch.uint8)


def header_buffer(device: torch.device) -> torch.Tensor:
    """An empty receive buffer for one shape header."""
    return torch.empty(SHAPE_WORDS * 8, dtype=torch.uint8, device=device)


def parse_header(buf: torch.Tensor, peer: int) -> tuple[int, torch.Size]:
    """(payload bytes, shape) from a received header; `CommError` if it is not one."""
    words = buf.view(torch.int64).tolist()
    magic, nbytes, ndim = words[0], words[1], words[2]
    if magic != _MAGIC or not 0 <= ndim <= MAX_NDIM or nbytes < 0:
        raise CommError(f"message from rank {peer} is not a shape header (magic {magic:#x}); "
                        f"both ranks must agree whether the shape is sent (sized vs "
                        f"self-describing transfer)")
    return nbytes, torch.Size(words[3:3 + ndim])
