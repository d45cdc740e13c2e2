"""TernGrad (Wen et al., NeurIPS 2017): unbiased stochastic ternarisation with a max-norm scale.

g~_i = s * sign(g_i) * b_i, with s = max_i |g_i| and b_i = 1 with probability |g_i| / s:
E[g~] = g. A worker sends s (fp32) and a 2-bit code per value (0: zero, 1: +s, 2: -s; 3,
never sent, decodes as zero); the scale differs between workers, so payloads are gathered.
The draws come from the compressor's counter-based stream (`stream.py`). The paper's
layer-wise scalar sharing and gradient clipping are left out (clip before compressing if
wanted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.compressors.packed import Packed, ScaledCodes
from approxdist.comm.compressors.stream import Stream, next_keys, uniform

if TYPE_CHECKING:
    from approxdist.comm.compressors.packed_bucket import Members

#: the bit pattern of +inf: max |x| patterns from here on are not finite
_INF = 0x7F800000


class TernGrad(Packed):
    """Ternary codes with a per-tensor max-norm scale and its own random stream."""

    def __init__(self, shape: torch.Size | tuple[int, ...], *, seed: int = 0,
                 device: torch.device | None = None) -> None:
        super().__init__("terngrad", shape, device)
        self.codes = ScaledCodes(2, self.numel)
        self.stream = Stream(seed, self.state)

    def encode(self, x: torch.Tensor) -> Payload:
        return self.encode_keyed(x, self.stream.next_key())

    def encode_keyed(self, x: torch.Tensor, key: int) -> Payload:
        """The payload of `x` with the draws of the step keyed `key`."""
        kernel = self.codes.encoder(x)
        found = None if kernel is None else kernel.max_magnitude(x)  # finite and > 0 only
        scale = max_magnitude(x) if found is None else found
        if kernel is None or found is None:
            return self.codes.pack(self.reference_codes(x, scale, key), scale, self.shape)
        payload, region = self.codes.blank(scale, self.shape, x.device)
        kernel.terngrad(x, float(scale), key, region)
        return payload

    def reference_codes(self, x: torch.Tensor, scale: torch.Tensor, key: int) -> torch.Tensor:
        """The codes by torch ops (`scale` = max |x|; none kept unless it is positive): kept
        where u * scale < |x|, with probability |x| / scale (no division per value)."""
        if scale > 0:
            keep = uniform(key, x.numel(), x.device).mul_(scale) < x.abs()
        else:
            keep = torch.zeros_like(x, dtype=torch.bool)
        return keep.to(torch.uint8) * torch.where(x < 0, 2, 1).to(torch.uint8)

    def encode_members(self, members: Members) -> None:
        """Every member's max |x| in one kernel call and its codes in one more (each with its
        own draws); a member whose max is zero or not finite by its torch path."""
        own = [c for c in members.comps if isinstance(c, TernGrad)]
        assert len(own) == members.count, "a bucket holds one compressor class"
        most = members.kernel.max_magnitudes(members.inputs, members.layout.lengths)
        keys = next_keys([c.stream for c in own])
        kept = (most != 0) & (most < _INF)
        scales = most.view(torch.float32)
        members.put_scales(scales)
        members.kernel.terngrad(members.inputs, members.layout.lengths, scales, keys,
                                members.codes_where(kept))
        members.by_torch(~kept, lambda i, x: own[i].encode_keyed(x, keys[i]))

    def values(self, scale: torch.Tensor | None) -> torch.Tensor:
        assert scale is not None
        return ternary(scale)

    def tables(self, scales: torch.Tensor | None, count: int) -> torch.Tensor:
        assert scales is not None
        return ternary(scales[:, 0])

    def from_codes(self, codes: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        return self.values(scale)[codes.long()]


def ternary(scale: torch.Tensor) -> torch.Tensor:
    """The values of codes 0-3 for each of `scale`'s values (a last dimension of 4)."""
    zero = torch.zeros_like(scale)
    return torch.stack([zero, scale, -scale, zero], dim=-1)


def max_magnitude(x: torch.Tensor) -> torch.Tensor:
    """max |x| as a 0-d tensor (0 for no values): from one min-max pass, no |x| tensor made
    (torch's inf-norm reduction is several times slower)."""
    if x.numel() == 0:
        return torch.zeros((), device=x.device)
    low, high = torch.aminmax(x)
    return torch.maximum(-low, high)
