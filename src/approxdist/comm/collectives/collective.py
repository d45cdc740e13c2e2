"""`Collective`: what every collective of this package keeps per rank and does per call.

`AllReduce`, `AllGather`, `ReduceScatter` and `Broadcast` are built once per (link,
codec) and called per tensor. Each holds its `PeerComm` (a `Link`'s `LinkComm`, or a
simulated world's), the codec and channel instances, reusable buffers, how errors name
the members (global ranks on a link's group) and the argument check's scheme. A call
signs its arguments (`check.Signature`), wraps the comm in the check and opens a `Wire`
(`call`); the algorithm then moves bytes through that wire only, so byte counts, trace
events and link emulation apply as for every other transfer of the link layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from approxdist.comm.buffers import BufferPool
from approxdist.comm.channel import Channel, get_channel
from approxdist.comm.codecs import Codec, get_codec
from approxdist.comm.collectives.base import OnComm, PeerComm
from approxdist.comm.collectives.check import CheckedComm, Signature, scheme
from approxdist.comm.collectives.check_head import HeadCheckedComm
from approxdist.comm.collectives.peers import LinkComm
from approxdist.comm.collectives.wire import SEGMENT_BYTES, Wire, decodes_into, link_segment
from approxdist.comm.link import Link
from approxdist.errors import CommError, SpecError
from approxdist.registry import Registry


class Collective(OnComm):
    """One rank's end of a collective over the members of a link's group (or a `PeerComm`)."""

    #: how signatures and errors name the collective ("all-gather", ...)
    kind = "collective"

    def __init__(self, transport: Link | PeerComm, codec: str | Codec = "fp32",
                 channel: str | Channel | None = None, *, check: bool | str = True,
                 segment_bytes: int | None = None, device: torch.device | None = None) -> None:
        self.link = transport if isinstance(transport, Link) else None
        self.comm: PeerComm = LinkComm(transport) if isinstance(transport, Link) else transport
        #: how errors name the members: global ranks on a link's group
        self.names = list(self.link.group.ranks) if self.link is not None else None
        self.emulated = self.link is not None and self.link.spec is not None
        self.device = device or (self.link.device if self.link is not None
                                 else torch.device("cpu"))
        self.codec = get_codec(codec) if isinstance(codec, str) else codec
        self.channel = get_channel(channel) if channel is None or isinstance(channel, str) \
            else channel
        self.check = scheme(check)  # None, "head" or "handshake" (`check.scheme`)
        if segment_bytes is not None and segment_bytes < 4:
            raise SpecError(f"segment_bytes {segment_bytes} must be >= 4 (one fp32 value)")
        self.segment_bytes = segment_bytes
        self.scratch = BufferPool()
        #: decoded values a channel's guard set to 0 (NaN/Inf), over all calls
        self.nonfinite = 0
        self._signatures: dict[Signature, torch.Tensor] = {}
        self._decode_into = decodes_into(self.codec)

    def members(self) -> str:
        """The members as errors name them: `global ranks 3, 1, 2` (or `N members`)."""
        if self.names is None:
            return f"{self.world_size} members"
        return f"{self.world_size} members (global ranks {', '.join(map(str, self.names))})"

    def segment(self, default: int = SEGMENT_BYTES) -> int:
        """fp32 bytes per segment: as given, else `default`, or on an emulated link enough
        that every message keeps the link busy (`wire.link_segment`)."""
        return self.segment_bytes or (link_segment(self.codec.bits_per_value)
                                      if self.emulated else default)

    def floating(self, x: torch.Tensor) -> None:
        """`CommError` unless `x` is a floating-point tensor."""
        if not x.is_floating_point():
            raise CommError(f"{self.kind} takes floating-point tensors, got {x.dtype}; "
                            f"convert with .float()")

    def _encoded(self, sig: Signature) -> torch.Tensor:
        """The signature's bytes, cached (the same calls repeat every training step)."""
        encoded = self._signatures.get(sig)
        if encoded is None:
            if len(self._signatures) > 256:
                self._signatures.clear()
            encoded = self._signatures[sig] = sig.encode(self.device)
        return encoded

    @contextlib.contextmanager
    def call(self, sig: Signature | None, segment: int) -> Iterator[Wire]:
        """The wire of one call: checked against `sig` (None: unchecked), in segments of
        `segment` fp32 bytes; the check is closed and non-finite counts kept on exit."""
        comm = self.comm
        checked: CheckedComm | HeadCheckedComm | None = None
        if sig is not None and self.check and self.world_size > 1:
            kind = CheckedComm if self.check == "handshake" else HeadCheckedComm
            comm = checked = kind(self.comm, sig, self._encoded(sig), self.scratch, self.names)
        wire = Wire(comm, self.codec, self.channel, self.scratch, self.device, self._decode_into)
        wire.segment_bytes = segment
        yield wire
        if checked is not None:
            checked.close()
        self.nonfinite += wire.nonfinite


def flat_fp32(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """`x`'s values as a flat contiguous fp32 tensor, and whether that is `x`'s own memory
    (fp32 and contiguous: a view), so writes land in `x`; otherwise a converted copy."""
    if x.dtype == torch.float32 and x.is_contiguous():
        return x.detach().view(-1), True
    return x.detach().reshape(-1).to(torch.float32).contiguous(), False


class SizedCollective(Collective):
    """A collective whose algorithm is named (a key of `algorithms`) or `auto`: `direct`
    up to `direct_max_bytes` of fp32 in the whole tensor, `large` above. Every member
    computes the same choice from the same size (and the signature carries it)."""

    algorithms: Registry[Any]
    large = "ring"
    direct_max_bytes = 256 << 10

    def __init__(self, transport: Link | PeerComm, codec: str | Codec = "fp32",
                 channel: str | Channel | None = None, *, algorithm: str = "auto",
                 check: bool | str = True, segment_bytes: int | None = None,
                 device: torch.device | None = None) -> None:
        super().__init__(transport, codec, channel, check=check, segment_bytes=segment_bytes,
                         device=device)
        if algorithm != "auto":
            self.algorithms.get(algorithm)  # an unknown name lists the valid ones
        self.algorithm = algorithm

    def pick(self, total_bytes: int) -> str:
        """The algorithm a call runs for a tensor of `total_bytes` fp32 bytes."""
        if self.algorithm != "auto":
            return self.algorithm
        return "direct" if total_bytes <= self.direct_max_bytes else self.large
