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

from approxdist.comm.channel import Channel
from approxdist.comm.codecs import Codec
from approxdist.comm.collectives.autocal import resolve
from approxdist.comm.collectives.base import PeerComm
from approxdist.comm.collectives.calibration import Calibration
from approxdist.comm.collectives.check import Signature
from approxdist.comm.collectives.collective import Collective, flat_fp32
from approxdist.comm.collectives.native import cast_dtype
from approxdist.comm.collectives.registry import get_algorithm
from approxdist.comm.link import Link
from approxdist.errors import CommError, SpecError

OPS = ("sum", "mean")


class AllReduce(Collective):
    """All-reduce on this rank; construct once per (algorithm, codec) and call repeatedly."""

    kind = "all-reduce"

    def __init__(self, transport: Link | PeerComm, algorithm: str = "ring",
                 codec: str | Codec = "fp32", channel: str | Channel | None = None, *,
                 calibration: Calibration | str | Path | None = None,
                 check: bool | str = True,
                 segment_bytes: int | None = None, device: torch.device | None = None) -> None:
        super().__init__(transport, codec, channel, check=check, segment_bytes=segment_bytes,
                         device=device)
        link = self.link
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

    def __call__(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce `x` over all ranks in place (`op` "sum" or "mean") and return it."""
        if op not in OPS:
            raise SpecError(f"all-reduce op {op!r} is not one of {', '.join(OPS)}")
        self.floating(x)
        work, in_place = flat_fp32(x)
        self._reduce(work, x.dtype, op)
        if op == "mean" and self.world_size > 1:
            work.div_(self.world_size)
        if not in_place:
            x.detach().copy_(work.view(x.shape))
        return x

    def _reduce(self, work: torch.Tensor, dtype: torch.dtype, op: str) -> None:
        algorithm = self.algorithm.select(work.numel() * 4, self.world_size)
        # on an emulated link, small segments keep it busy while ranks encode, add, decode
        segment = self.segment(algorithm.segment_bytes)
        sig = None if algorithm.name == "native" else \
            Signature(work.numel(), dtype, op, algorithm.name, self.codec.spec,
                      self.world_size, segment)
        with self.call(sig, segment) as wire:
            algorithm.run(wire, work)


def all_reduce(x: torch.Tensor, transport: Link | PeerComm, algorithm: str = "ring",
               codec: str | Codec = "fp32", op: str = "sum") -> torch.Tensor:
    """One-off convenience; prefer a kept `AllReduce` for repeated calls (buffers, codecs)."""
    return AllReduce(transport, algorithm, codec)(x, op)
