"""One bit a value: scaled sign with error feedback and signSGD with majority vote.

* `sign+ef` (EF-SignSGD, Karimireddy et al., ICML 2019, Algorithm 1; the idea under
  DeepSpeed's 1-bit Adam): p = g + e; send (||p||_1 / d) * sign(p); e <- p - that.
  A worker sends the scale (fp32) and d sign bits; the workers' decoded tensors are averaged.
* `signsgd` (Bernstein et al., ICML 2018 / ICLR 2019, majority vote): a worker sends only
  sign(g), d bits; the result is the sign of the sum of the workers' signs (0 on a tie).
  Signum is this with momentum, which belongs to the optimiser.
Bit i of the stream is 1 for a negative value (sign(0) is sent as +1).
"""

from __future__ import annotations

import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.compressors.base import Gathered, in_order
from approxdist.comm.compressors.packed import ScaledCodes


class ScaledSign(Gathered):
    """EF-SignSGD: the sign of gradient plus residual, times its mean magnitude."""

    feedback = True

    def __init__(self, shape: torch.Size | tuple[int, ...],
                 device: torch.device | None = None) -> None:
        super().__init__("sign+ef", shape, device)
        self.codes = ScaledCodes(1, self.numel)

    def wire_bytes(self) -> int:
        return self.codes.nbytes()

    def encode(self, x: torch.Tensor) -> Payload:
        scale = x.abs().sum() / max(x.numel(), 1)
        return self.codes.pack(x < 0, scale, self.shape)

    def decode(self, payload: Payload) -> torch.Tensor:
        codes, scale = self.codes.unpack(payload)
        assert scale is not None
        return signs(codes).mul_(scale)


class MajorityVote(Gathered):
    """signSGD with majority vote: d bits a worker, the sign of the vote back."""

    def __init__(self, shape: torch.Size | tuple[int, ...],
                 device: torch.device | None = None) -> None:
        super().__init__("signsgd", shape, device)
        self.codes = ScaledCodes(1, self.numel, scaled=False)

    def wire_bytes(self) -> int:
        return self.codes.nbytes()

    def encode(self, x: torch.Tensor) -> Payload:
        return self.codes.pack(x < 0, None, self.shape)

    def decode(self, payload: Payload) -> torch.Tensor:
        codes, _ = self.codes.unpack(payload)
        return signs(codes)

    def aggregate(self, decoded: list[torch.Tensor]) -> torch.Tensor:
        return in_order(decoded).sign_()


def signs(codes: torch.Tensor) -> torch.Tensor:
    """1 - 2 * code: +1 for a 0 bit, -1 for a 1 bit (fp32)."""
    return codes.to(torch.float32).mul_(-2.0).add_(1.0)
