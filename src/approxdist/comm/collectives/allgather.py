"""`AllGather`: every member's tensor, concatenated along dim 0 in member order, on every member.

    link = Link(ctx, group=tp_group)                  # or a PeerComm (simulated world)
    gather = AllGather(link, codec="bf16")            # keep it: buffers are reused
    y = gather(x)                                     # (n * x.shape[0], *x.shape[1:])

The counterpart of `dist.all_gather_into_tensor` (`all_gather_single` in torch 2.13) on
our link layer: real bytes of the codec's payload cross the wire, counted and traced by
the link, shaped by its emulation. Every member must pass the same shape and dtype (any
floating dtype; the result has it). Algorithms: `ring` (`allgather_ring.py`, bandwidth-
optimal, pipelined in segments), `direct` (`allgather_direct.py`, one step) and `auto`,
which takes `direct` up to `direct_max_bytes` of result and `ring` above.

**Where the codec acts**: each member encodes its own block exactly once (as fp32
values, after casting x to fp32), the channel corrupts that encoding once, and every
member, the owner included, decodes those same bytes; forwarding never re-encodes. So
block i of the result is `decode(encode(x_i))` on every member, bitwise identical, and
its error is one application of the codec to x_i (with one member, nothing crosses the
wire and the result is x). fp32 without a channel sends the values' own bytes.

**Bytes**: a uint8 `x` is gathered as it is, byte for byte (codec fp32, no channel): how
a compressor's payloads travel (`data_parallel/compressed.py`, docs/compressors.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from approxdist.comm.collectives.allgather_direct import direct
from approxdist.comm.collectives.allgather_ring import ring
from approxdist.comm.collectives.check import Signature
from approxdist.comm.collectives.collective import SizedCollective
from approxdist.comm.collectives.wire import Wire
from approxdist.errors import CommError, SpecError
from approxdist.registry import Registry

GatherAlgorithm = Callable[[Wire, list[torch.Tensor]], None]
GATHER_ALGORITHMS: Registry[GatherAlgorithm] = Registry("all-gather algorithm", SpecError)
GATHER_ALGORITHMS.add("ring", ring)
GATHER_ALGORITHMS.add("direct", direct)


class AllGather(SizedCollective):
    """All-gather on this rank; construct once per (link, codec) and call repeatedly.

    `AllGather(link, codec="fp32", channel=None, *, algorithm="auto", check=True,
    segment_bytes=None, device=None)`; `auto` gathers results up to `direct_max_bytes`
    of fp32 directly, larger ones around the ring.
    """

    kind = "all-gather"
    algorithms = GATHER_ALGORITHMS
    direct_max_bytes = 256 << 10

    def __call__(self, x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """Every member's `x` concatenated along dim 0 in member order (into `out` if given)."""
        raw_bytes = x.dtype == torch.uint8
        if raw_bytes:
            self.exact_bytes()
        else:
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
        kind = x.dtype if raw_bytes else torch.float32
        direct_out = out is not None and out.dtype == kind and out.is_contiguous()
        work = out.detach().view(-1) if out is not None and direct_out else \
            torch.empty(n * m, dtype=kind, device=x.device)
        blocks = [work[i * m:(i + 1) * m] for i in range(n)]
        blocks[self.rank].copy_(x.detach().reshape(-1))
        name, segment = self.pick(n * m * work.element_size()), self.segment()
        sig = Signature(m, x.dtype, "sum", name, self.codec.spec, n, segment, self.kind,
                        tuple(x.shape))
        with self.call(sig, segment) as wire:
            wire.itemsize = work.element_size()
            if n > 1 and m > 0:  # else this member's block is the whole result
                GATHER_ALGORITHMS.get(name)(wire, blocks)
        if out is not None:
            return out if direct_out else out.detach().copy_(work.view(shape))
        return work.view(shape) if x.dtype == kind else work.view(shape).to(x.dtype)

    def exact_bytes(self) -> None:
        """`CommError` unless bytes can travel as they are (codec fp32, no channel)."""
        if self.codec.spec != "fp32" or not self.channel.is_identity:
            raise CommError(f"all-gather of bytes (uint8) sends them as they are, but this one "
                            f"has codec {self.codec.spec!r} and channel "
                            f"{'none' if self.channel.is_identity else 'on'}; build it with "
                            f"codec='fp32' and no channel")
