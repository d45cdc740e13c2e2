"""TernGrad (Wen et al., NeurIPS 2017): unbiased stochastic ternarisation with a max-norm scale.

g~_i = s * sign(g_i) * b_i, with s = max_i |g_i| and b_i = 1 with probability |g_i| / s:
E[g~] = g. A worker sends s (fp32) and a 2-bit code per value (0: zero, 1: +s, 2: -s; 3,
never sent, decodes as zero); the scale differs between workers, so payloads are gathered.
The draws come from the compressor's counter-based stream (`stream.py`). The paper's
layer-wise scalar sharing and gradient clipping are left out (clip before compressing if
wanted).
"""

from __future__ import annotations

import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.compressors.packed import Packed, ScaledCodes
from approxdist.comm.compressors.stream import Stream, uniform


class TernGrad(Packed):
    """Ternary codes with a per-tensor max-norm scale and its own random stream."""

    def __init__(self, shape: torch.Size | tuple[int, ...], *, seed: int = 0,
                 device: torch.device | None = None) -> None:
        super().__init__("terngrad", shape, device)
        self.codes = ScaledCodes(2, self.numel)
        self.stream = Stream(seed, self.state)

    def encode(self, x: torch.Tensor) -> Payload:
        kernel = self.codes.encoder(x)
        found = None if kernel is None else kernel.max_magnitude(x)  # finite and > 0 only
        scale = max_magnitude(x) if found is None else found
        key = self.stream.next_key()
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

    def values(self, scale: torch.Tensor | None) -> torch.Tensor:
        assert scale is not None
        zero = torch.zeros_like(scale)
        return torch.stack([zero, scale, -scale, zero])

    def from_codes(self, codes: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        return self.values(scale)[codes.long()]


def max_magnitude(x: torch.Tensor) -> torch.Tensor:
    """max |x| as a 0-d tensor (0 for no values): from one min-max pass, no |x| tensor made
    (torch's inf-norm reduction is several times slower)."""
    if x.numel() == 0:
        return torch.zeros((), device=x.device)
    low, high = torch.aminmax(x)
    return torch.maximum(-low, high)
