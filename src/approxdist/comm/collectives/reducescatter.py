"""`ReduceScatter`: member i gets the sum over all members of chunk i of their tensors.

    scatter = ReduceScatter(link, codec="bf16")       # keep it: buffers are reused
    y = scatter(x, op="sum")                          # (x.shape[0] // n, *x.shape[1:])

The counterpart of `dist.reduce_scatter_tensor` (`reduce_scatter_single` in torch 2.13)
on our link layer. x is cut along dim 0 into n equal chunks (x.shape[0] must be
divisible by the group size); every member must pass the same shape and dtype (any
floating dtype, summed in fp32; the result has x's dtype). `op="mean"` divides the sum
by n. Algorithms: `ring` (`reducescatter_ring.py`, bandwidth-optimal, pipelined in
segments), `direct` (`reducescatter_direct.py`, one step) and `auto`, which takes
`direct` up to `direct_max_bytes` of input and `ring` above. x is not changed.

**Where the codec acts**, so that the error bound follows (u: the codec's relative error,
|dec(enc(v)) - v| <= u |v|, 0 for fp32 and 2^-8 for bf16; u32 = 2^-24 per fp32 addition):
* `ring`: the partial sum of each value segment (`layout.value_segments`) is encoded by
  the member that sends it, and the next member decodes it and adds its own values in
  fp32, along `layout.ring_sum_order(i, n)`: p = x_(i+1); p = x_next + dec(enc(p)), ...;
  the result is x_i + dec(enc(p)). A summand goes through at most n-1 encodes and n-1
  additions, so |result - exact| <= ((1+u)^(n-1) (1+u32)^(n-1) - 1) sum_j |x_j|.
* `direct`: each member's chunk i is encoded once (as a whole) and member i adds the
  decoded values to its own along `layout.direct_sum_order(i, n)`: result = x_i +
  dec(enc(x_(i-1))) + ...; |result - exact| <= ((1+u) (1+u32)^(n-1) - 1) sum_j |x_j|.
A codec with an absolute floor (fp8's subnormals) adds it once per encode. The codec
never touches member i's own values; with one member the result is x.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from approxdist.comm.collectives.allreduce import OPS
from approxdist.comm.collectives.check import Signature
from approxdist.comm.collectives.collective import SizedCollective, flat_fp32
from approxdist.comm.collectives.reducescatter_direct import direct
from approxdist.comm.collectives.reducescatter_ring import ring
from approxdist.comm.collectives.wire import Wire
from approxdist.errors import SpecError
from approxdist.registry import Registry

ScatterAlgorithm = Callable[[Wire, list[torch.Tensor], torch.Tensor], None]
SCATTER_ALGORITHMS: Registry[ScatterAlgorithm] = Registry("reduce-scatter algorithm",
                                                          SpecError)
SCATTER_ALGORITHMS.add("ring", ring)
SCATTER_ALGORITHMS.add("direct", direct)


class ReduceScatter(SizedCollective):
    """Reduce-scatter on this rank; construct once per (link, codec) and call repeatedly.

    `ReduceScatter(link, codec="fp32", channel=None, *, algorithm="auto", check=True,
    segment_bytes=None, device=None)`; `auto` reduce-scatters inputs up to
    `direct_max_bytes` of fp32 directly, larger ones around the ring.
    """

    kind = "reduce-scatter"
    algorithms = SCATTER_ALGORITHMS
    direct_max_bytes = 256 << 10

    def __call__(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """This member's chunk of dim 0, summed (or averaged, `op="mean"`) over the members."""
        if op not in OPS:
            raise SpecError(f"reduce-scatter op {op!r} is not one of {', '.join(OPS)}")
        self.floating(x)
        n = self.world_size
        rows = x.shape[0] if x.dim() else 0
        if x.dim() == 0 or rows % n:
            fix = -(-rows // n) * n if x.dim() else n
            raise SpecError(f"reduce-scatter cuts dim 0 into one chunk per member of the "
                            f"{self.members()}, but x has shape {tuple(x.shape)}: dim 0 "
                            f"({rows}) is not divisible by {n}; pad dim 0 to {fix}")
        flat, _ = flat_fp32(x)
        k = flat.numel() // n
        result = torch.empty(k, device=flat.device)
        name, segment = self.pick(flat.numel() * 4), self.segment()
        sig = Signature(flat.numel(), x.dtype, op, name, self.codec.spec, n, segment,
                        self.kind, tuple(x.shape))
        chunks = [flat[i * k:(i + 1) * k] for i in range(n)]
        with self.call(sig, segment) as wire:
            if n > 1 and k > 0:
                SCATTER_ALGORITHMS.get(name)(wire, chunks, result)
            else:  # this member's chunk is the whole sum
                result.copy_(chunks[self.rank])
        if op == "mean" and n > 1:
            result.div_(n)
        shape = (rows // n, *x.shape[1:])
        return result.view(shape) if x.dtype == torch.float32 else result.view(shape).to(x.dtype)
