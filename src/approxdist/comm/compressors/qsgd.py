"""QSGD (Alistarh et al., NeurIPS 2017): unbiased stochastic quantisation to s levels.

Q_s(v)_i = ||v||_2 * sign(v_i) * (l_i + b_i) / s, with a_i = s |v_i| / ||v||_2,
l_i = floor(a_i) and b_i = 1 with probability a_i - l_i (else 0): E[Q_s(v)] = v. A worker
sends the norm (fp32) and one code per value, sign * level + s in [0, 2s], bit-packed in
ceil(log2(2s + 1)) bits. The norm differs between workers, so payloads are gathered.
"""

from __future__ import annotations

import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.compressors.base import Gathered, seeded
from approxdist.comm.compressors.packed import ScaledCodes
from approxdist.errors import SpecError

MAX_LEVELS = 1 << 15


class QSGD(Gathered):
    """s-level QSGD with its own random stream (seeded per worker), no error feedback."""

    def __init__(self, levels: int, shape: torch.Size | tuple[int, ...], *, seed: int = 0,
                 device: torch.device | None = None) -> None:
        super().__init__(f"qsgd:{levels}", shape, device)
        self.levels = levels
        self.codes = ScaledCodes((2 * levels).bit_length(), self.numel)
        self.generator = seeded(seed)

    def wire_bytes(self) -> int:
        return self.codes.nbytes()

    def encode(self, x: torch.Tensor) -> Payload:
        s = self.levels
        norm = torch.linalg.vector_norm(x)
        a = x.abs().mul_(s / norm) if norm > 0 else torch.zeros_like(x)
        low = a.floor()
        level = low + (self._uniform(x.numel()) < a - low)
        level.clamp_(max=s)
        codes = torch.where(x < 0, -level, level).add_(s)
        return self.codes.pack(codes, norm, self.shape)

    def decode(self, payload: Payload) -> torch.Tensor:
        codes, norm = self.codes.unpack(payload)
        assert norm is not None
        return codes.sub_(self.levels).to(torch.float32).mul_(norm / self.levels)


def parse_levels(text: str | None) -> int:
    """`qsgd:<s>` -> s in [2, 2**15]."""
    if text is None or not text.isdigit() or not 2 <= int(text) <= MAX_LEVELS:
        raise SpecError(f"qsgd levels {text!r} must be an integer in [2, {MAX_LEVELS}] (qsgd:1 "
                        f"keeps only sign and norm: use terngrad); e.g. qsgd:16 (6 bits a value)")
    return int(text)
