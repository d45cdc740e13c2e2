"""`AllGather`: every member's tensor, concatenated along dim 0 in member order, on every member.

    link = Link(ctx, group=tp_group)                  # or a PeerComm (simulated world)
    gather = AllGather(link, codec="bf16")            # keep it: buffers are reused
    y = gather(x)                                     # (n * x.shape[0], *x.shape[1:])

The counterpart of `dist.all_gather_into_tensor` (`all_gather_single` in torch 2.13) on
our link layer: real bytes of the codec's payload cross the wire, counted and traced by
the link, shaped by its emulation. Every member must pass the same shape and dtype (any
floating dtype; the result has it). Algorithms: `ring` (`allgather_ring.py`, bandwidth-
optimal, pipelined in segments), `direct` (`allgather_direct.py`, one step) and `auto`,
which takes `direct` up to `DIRECT_MAX_BYTES` of result and `ring` above.

**Where the codec acts**: each member encodes its own block exactly once (as fp32
values, after casting x to fp32), the channel corrupts that encoding once, and every
member, the owner included, decodes those same bytes; forwarding never re-encodes. So
block i of the result is `decode(encode(x_i))` on every member, bitwise identical, and
its error is one application of the codec to x_i (with one member, nothing crosses the
wire and the result is x). fp32 without a channel sends the values' own bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from approxdist.comm.channel import Channel
from approxdist.comm.codecs import Codec
from approxdist.comm.collectives.allgather_direct import direct
from approxdist.comm.collectives.allgather_ring import ring
from approxdist.comm.collectives.base import PeerComm
from approxdist.comm.collectives.check import Signature
from approxdist.comm.collectives.collective import Collective
from approxdist.comm.collectives.wire import SEGMENT_BYTES, Wire, link_segment
from approxdist.comm.link import Link
from approxdist.errors import SpecError
from approxdist.registry import Registry

GatherAlgorithm = Callable[[Wire, list[torch.Tensor]], None]
GATHER_ALGORITHMS: Registry[GatherAlgorithm] = Registry("all-gather algorithm", SpecError)
GATHER_ALGORITHMS.add("ring", ring)
GATHER_ALGORITHMS.add("direct", direct)
#: `auto` gathers results up to this many fp32 bytes directly, larger ones around the ring
DIRECT_MAX_BYTES = 256 << 10


def gather_algorithm(total_bytes: int, name: str = "auto") -> str:
    """The algorithm `name` runs for a result of `total_bytes` fp32 bytes."""
    if name != "auto":
        return name
    return "direct" if total_bytes <= DIRECT_MAX_BYTES else "ring"


class AllGather(Collective):
    """All-gather on this rank; construct once per (link, codec) and call repeatedly."""

    kind = "all-gather"

    def __init__(self, transport: Link | PeerComm, codec: str | Codec = "fp32",
                 channel: str | Channel | None = None, *, algorithm: str = "auto",
                 check: bool | str = True, segment_bytes: int | None = None,
                 device: torch.device | None = None) -> None:
        super().__init__(transport, codec, channel, check=check, segment_bytes=segment_bytes,
                         device=device)
        if algorithm != "auto":
            GATHER_ALGORITHMS.get(algorithm)  # an unknown name lists the valid ones
        self.algorithm = algorithm

    def __call__(self, x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """Every member's `x` concatenated along dim 0 in member order (into `out` if given)."""
        self.floating(x)
        if x.dim() == 0:
            raise SpecError("all-gather concatenates along dim 0, but x is a 0-d tensor; "
                            "pass x.reshape(1)")
        n, m = self.world_size, x.numel()
        shape = (n * x.shape[0], *x.shape[1:])
        if out is not None and tuple(out.shape) != shape:
            raise SpecError(f"all-gather of {tuple(x.shape)} over {n} members fills "
                            f"{shape}, but out has shape {tuple(out.shape)}; pass out of "
                            f"shape {shape} or none")
        direct_out = out is not None and out.dtype == torch.float32 and out.is_contiguous()
        work = out.detach().view(-1) if out is not None and direct_out else \
            torch.empty(n * m, device=x.device)
        blocks = [work[i * m:(i + 1) * m] for i in range(n)]
        blocks[self.rank].copy_(x.detach().reshape(-1))
        name = gather_algorithm(n * m * 4, self.algorithm)
        segment = self.segment_bytes or (link_segment(self.codec.bits_per_value)
                                         if self.emulated else SEGMENT_BYTES)
        sig = Signature(m, x.dtype, "sum", name, self.codec.spec, n, segment, self.kind,
                        tuple(x.shape))
        with self.call(sig, segment) as wire:
            GATHER_ALGORITHMS.get(name)(wire, blocks)
        if out is not None:
            return out if direct_out else out.detach().copy_(work.view(shape))
        return work.view(shape) if x.dtype == torch.float32 else work.view(shape).to(x.dtype)
