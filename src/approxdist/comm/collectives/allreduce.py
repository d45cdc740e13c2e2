"""`AllReduce`: one rank's reusable all-reduce with an algorithm, a codec and a channel (seed 001).

    link = Link(ctx, "bw=1gbit")                       # or a PeerComm (simulated world)
    reduce = AllReduce(link, "auto", codec="bf16")    # keep it: buffers are reused
    reduce(grad, op="mean")                             # in place, returns grad

The call reduces over the members of the link's group (`Link(ctx, group=...)`, the
world by default), so the same algorithms serve a stage's replicas or any sub-group.

Input: any floating tensor of any shape; it is reduced in fp32 and written back in its
own dtype. All ranks must pass the same length, dtype, op, algorithm, codec and segment
size; with `check=True` (default) a mismatch raises a `CommError` naming the ranks and
values on the ranks that detect it; the others fail as soon as those exit. On one host
the signature rides on each pair's first message (`check_head.py`); where the ranks span
hosts it is swapped before the data (`check.py`), which a real TCP link needs;
`check="head"` or `"handshake"` picks one (`check.scheme`).
With fp32 and no channel the result equals `dist.all_reduce` within fp32 rounding; with
any codec all ranks end bitwise identical. One `AllReduce` serves one thread at a time.
"""

from __future__ import annotations

from pathlib import Path

import torch

from approxdist.comm.buffers import BufferPool
from approxdist.comm.channel import Channel, get_channel
from approxdist.comm.codecs import Codec, get_codec
from approxdist.comm.collectives.autocal import resolve
from approxdist.comm.collectives.base import PeerComm
from approxdist.comm.collectives.calibration import Calibration
from approxdist.comm.collectives.check import CheckedComm, Signature, scheme
from approxdist.comm.collectives.check_head import HeadCheckedComm
from approxdist.comm.collectives.native import cast_dtype
from approxdist.comm.collectives.peers import LinkComm
from approxdist.comm.collectives.registry import get_algorithm
from approxdist.comm.collectives.wire import Wire, decodes_into, link_segment
from approxdist.comm.link import Link
from approxdist.errors import CommError, SpecError

OPS = ("sum", "mean")


class AllReduce:
    """All-reduce on this rank; construct once per (algorithm, codec) and call repeatedly."""

    def __init__(self, transport: Link | PeerComm, algorithm: str = "ring",
                 codec: str | Codec = "fp32", channel: str | Channel | None = None, *,
                 calibration: Calibration | str | Path | None = None,
                 check: bool | str = True,
                 segment_bytes: int | None = None, device: torch.device | None = None) -> None:
        link = transport if isinstance(transport, Link) else None
        self.comm: PeerComm = LinkComm(transport) if isinstance(transport, Link) else transport
        #: how errors name the members: global ranks on a link's group
        self.names = list(link.group.ranks) if link is not None else None
        self.emulated = link is not None and link.spec is not None
        self.device = device or (link.device if link is not None else torch.device("cpu"))
        self.codec = get_codec(codec) if isinstance(codec, str) else codec
        self.channel = get_channel(channel) if channel is None or isinstance(channel, str) \
            else channel
        exact_fp32 = self.codec.spec == "fp32" and self.channel.is_identity
        if calibration == "off":
            calibration = None
        elif calibration == "measure":  # collective: every member builds its all-reduce now
            if link is None:
                raise CommError("calibration='measure' measures over a Link; pass a calibration "
                                "file or 'off' on a simulated world")
            calibration = resolve(link, "measure", algorithm)
        self.algorithm = get_algorithm(algorithm, calibration=calibration,
                                       link=link.spec if link else None,
                                       wire_fraction=self.codec.bits_per_value / 32,
                                       native_ok=exact_fp32,
                                       encodes=not exact_fp32)
        if not self.algorithm.any_codec:
            cast_dtype(self.codec.spec, not self.channel.is_identity)
        self.check = scheme(check)  # None, "head" or "handshake" (`check.scheme`)
        if segment_bytes is not None and segment_bytes < 4:
            raise SpecError(f"segment_bytes {segment_bytes} must be >= 4 (one fp32 value)")
        self.segment_bytes = segment_bytes
        self.scratch = BufferPool()
        self.nonfinite = 0
        self._signatures: dict[Signature, torch.Tensor] = {}
        self._decode_into = decodes_into(self.codec)

    @property
    def world_size(self) -> int:
        """Members taking part (the link's group; each call reduces over all of them)."""
        return self.comm.world_size

    def __call__(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce `x` over all ranks in place (`op` "sum" or "mean") and return it."""
        if op not in OPS:
            raise SpecError(f"all-reduce op {op!r} is not one of {', '.join(OPS)}")
        if not x.is_floating_point():
            raise CommError(f"all-reduce takes floating-point tensors, got {x.dtype}; "
                            f"convert with .float()")
        in_place = x.dtype == torch.float32 and x.is_contiguous()
        work = x.detach().view(-1) if in_place else \
            x.detach().reshape(-1).to(torch.float32).contiguous()
        self._reduce(work, x.dtype, op)
        if op == "mean" and self.world_size > 1:
            work.div_(self.world_size)
        if not in_place:
            x.detach().copy_(work.view(x.shape))
        return x

    def _encoded(self, sig: Signature) -> torch.Tensor:
        """The signature's bytes, cached (the same calls repeat every training step)."""
        encoded = self._signatures.get(sig)
        if encoded is None:
            if len(self._signatures) > 256:
                self._signatures.clear()
            encoded = self._signatures[sig] = sig.encode(self.device)
        return encoded

    def _reduce(self, work: torch.Tensor, dtype: torch.dtype, op: str) -> None:
        algorithm = self.algorithm.select(work.numel() * 4, self.world_size)
        # on an emulated link, small segments keep it busy while ranks encode, add, decode
        segment = self.segment_bytes or (link_segment(self.codec.bits_per_value)
                                         if self.emulated else algorithm.segment_bytes)
        comm = self.comm
        checked: CheckedComm | HeadCheckedComm | None = None
        if self.check and algorithm.name != "native" and self.world_size > 1:
            sig = Signature(work.numel(), dtype, op, algorithm.name, self.codec.spec,
                            self.world_size, segment)
            kind = CheckedComm if self.check == "handshake" else HeadCheckedComm
            comm = checked = kind(self.comm, sig, self._encoded(sig), self.scratch, self.names)
        wire = Wire(comm, self.codec, self.channel, self.scratch, self.device, self._decode_into)
        wire.segment_bytes = segment
        algorithm.run(wire, work)
        if checked is not None:
            checked.close()
        self.nonfinite += wire.nonfinite


def all_reduce(x: torch.Tensor, transport: Link | PeerComm, algorithm: str = "ring",
               codec: str | Codec = "fp32", op: str = "sum") -> torch.Tensor:
    """One-off convenience; prefer a kept `AllReduce` for repeated calls (buffers, codecs)."""
    return AllReduce(transport, algorithm, codec)(x, op)
