"""TernGrad (Wen et al., NeurIPS 2017): unbiased stochastic ternarisation with a max-norm scale.

g~_i = s * sign(g_i) * b_i, with s = max_i |g_i| and b_i = 1 with probability |g_i| / s:
E[g~] = g. A worker sends s (fp32) and a 2-bit code per value (0: zero, 1: +s, 2: -s); the
scale differs between workers, so payloads are gathered. The paper's layer-wise scalar
sharing and gradient clipping are left out (clip before compressing if wanted).
"""

from __future__ import annotations

import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.compressors.base import Gathered, seeded
from approxdist.comm.compressors.packed import ScaledCodes


class TernGrad(Gathered):
    """Ternary codes with a per-tensor max-norm scale and its own random stream."""

    def __init__(self, shape: torch.Size | tuple[int, ...], *, seed: int = 0,
                 device: torch.device | None = None) -> None:
        super().__init__("terngrad", shape, device)
        self.codes = ScaledCodes(2, self.numel)
        self.generator = seeded(seed)

    def wire_bytes(self) -> int:
        return self.codes.nbytes()

    def encode(self, x: torch.Tensor) -> Payload:
        scale = x.abs().max() if x.numel() else torch.zeros(())
        p = x.abs().div_(scale) if scale > 0 else torch.zeros_like(x)
        keep = self._uniform(x.numel()) < p
        codes = keep.to(torch.uint8) * torch.where(x < 0, 2, 1).to(torch.uint8)
        return self.codes.pack(codes, scale, self.shape)

    def decode(self, payload: Payload) -> torch.Tensor:
        codes, scale = self.codes.unpack(payload)
        assert scale is not None
        table = torch.stack([torch.zeros_like(scale), scale, -scale])
        return table[codes.long()]
