"""One-process oracles of all-gather, reduce-scatter and broadcast with a codec on the wire.

Where the collectives encode and decode is documented in their modules; these functions
apply the same codec steps to the same values in one process:

* all-gather / broadcast: each member's block (the root's tensor) is encoded once and
  every member holds `decode(encode(x))`: `coded`;
* reduce-scatter: `scatter_replay` follows `layout.ring_sum_order` (ring: the partial
  sum of each value segment re-encoded at every hop) or `layout.direct_sum_order`
  (direct: each member's chunk encoded once) and must match bitwise;
  `scatter_bound` is the error bound those orders give against the exact sum.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from approxdist.comm.codecs import get_codec
from approxdist.comm.collectives.layout import direct_sum_order, ring_sum_order, value_segments

U32 = 2.0 ** -24
#: per codec: (u, f) with |dec(enc(v)) - v| <= u |v| + f max|v| over the encoded piece.
#: bf16: round to nearest with 8 significant bits; fp8-e5m2 (scaled so that max|v| * 2^-k
#: lies in (28672, 57344]): 3 significant bits, and below its smallest normal (2^-14 in
#: scaled units) an absolute 2^-17 * 2^k < max|v| 2^-31; fp8-e4m3 (max|v| * 2^-k in
#: (224, 448]): 4 significant bits, and among its subnormals (spaced 2^-9 in scaled units)
#: an absolute 2^-10 * 2^k < max|v| 2^-17 (docs/codecs.md)
RELATIVE = {"fp32": (0.0, 0.0), "bf16": (2.0 ** -8, 0.0), "fp8-e5m2": (2.0 ** -3, 2.0 ** -31),
            "fp8-e4m3": (2.0 ** -4, 2.0 ** -17)}
#: fp16 (not scaled): 11 significant bits, and below its smallest normal an absolute half
#: of its smallest subnormal, 2^-25: |dec(enc(v)) - v| <= FP16[0] |v| + FP16[1]
FP16 = (2.0 ** -11, 2.0 ** -25)


def allreduce_relative(codec: str, world: int) -> float:
    """An all-reduce of `world` inputs with `codec` on the wire is within this times
    sum_i |x_i| of the exact sum, element-wise: each value is re-encoded (within u of itself)
    and added in fp32 (within 2^-24) at most world + 2 times on its way
    (docs/collectives.md); with fp32 on the wire, only the additions round."""
    u, f = RELATIVE[codec]
    assert f == 0.0, f"{codec} has an absolute term too; use scatter_bound"
    return (world + 2) * (u + U32)


def coded(x: torch.Tensor, codec: str, world: int) -> torch.Tensor:
    """What every member holds of a block `x` that crossed the wire once (x itself when
    there is no wire: one member)."""
    if world == 1:
        return x.float()
    c = get_codec(codec)
    return c.decode(c.encode(x.float().reshape(-1))).view(x.shape)


def scatter_replay(xs: Sequence[torch.Tensor], codec: str, algorithm: str, member: int,
                   segment_bytes: int) -> torch.Tensor:
    """Member `member`'s reduce-scatter result, computed in one process (flat fp32)."""
    n = len(xs)
    flat = [x.float().reshape(-1) for x in xs]
    k = flat[0].numel() // n
    chunk = [f[member * k:(member + 1) * k] for f in flat]
    if n == 1:
        return chunk[0].clone()
    c = get_codec(codec)

    def wire(v: torch.Tensor) -> torch.Tensor:
        return c.decode(c.encode(v))

    if algorithm == "direct":
        order = direct_sum_order(member, n)
        out = chunk[order[0]].clone()
        for m in order[1:]:
            out = out + wire(chunk[m])
        return out
    out = torch.empty(k)
    order = ring_sum_order(member, n)
    for a, b in value_segments(k, segment_bytes):
        p = chunk[order[0]][a:b].clone()
        for m in order[1:]:
            p = chunk[m][a:b] + wire(p)
        out[a:b] = p
    return out


def scatter_bound(xs: Sequence[torch.Tensor], codec: str, algorithm: str,
                  member: int) -> torch.Tensor:
    """|result - exact sum| allowed element-wise for member `member`'s chunk.

    With c = (1 + u)(1 + u32): every summand is multiplied by at most c^(n-1) (ring: up
    to n-1 encodes and additions after it) or (1 + u)(1 + u32)^(n-1) (direct: one encode,
    n-1 additions), so the relative part is (factor - 1) sum_j |x_j|; each encode adds at
    most f times the largest partial sum, itself at most factor * max sum_j |x_j|.
    """
    n = len(xs)
    u, f = RELATIVE[codec]
    k = xs[0].numel() // n
    mag = torch.stack([x.double().reshape(-1)[member * k:(member + 1) * k].abs()
                       for x in xs]).sum(0)
    hops = 1 if algorithm == "direct" else n - 1  # encodes on a summand's way
    factor = (1 + u) ** hops * (1 + U32) ** (n - 1)
    top = float(mag.max()) if mag.numel() else 0.0
    return (factor - 1) * mag + (n - 1) * f * factor * factor * top
