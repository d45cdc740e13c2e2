"""One bit a value: scaled sign with error feedback and signSGD with majority vote.

* `sign+ef` (EF-SignSGD, Karimireddy et al., ICML 2019, Algorithm 1; the idea under
  DeepSpeed's 1-bit Adam): p = g + e; send (||p||_1 / d) * sign(p); e <- p - that.
  A worker sends the scale (fp32) and d sign bits; the workers' decoded tensors are averaged.
* `signsgd` (Bernstein et al., ICML 2018 / ICLR 2019, majority vote): a worker sends only
  sign(g), d bits; the result is the sign of the sum of the workers' signs (0 on a tie).
  Signum is this with momentum, which belongs to the optimiser.
Bit i of the stream is 1 for a negative value (sign(0) is sent as +1). On CPU one kernel
pass packs the bits and, for `sign+ef`, writes the new residual (`kernels/quantize.c`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.compressors.ordered import ordered_sum
from approxdist.comm.compressors.packed import Packed, ScaledCodes
from approxdist.kernels.compress import sum_chunks

if TYPE_CHECKING:
    from approxdist.comm.compressors.packed_bucket import Members


class ScaledSign(Packed):
    """EF-SignSGD: the sign of gradient plus residual, times its mean magnitude."""

    feedback = True

    def __init__(self, shape: torch.Size | tuple[int, ...],
                 device: torch.device | None = None) -> None:
        super().__init__("sign+ef", shape, device)
        self.codes = ScaledCodes(1, self.numel)
        self._chunk_sums: torch.Tensor | None = None

    def encode(self, x: torch.Tensor) -> Payload:
        return self._encode(x, None)

    def mean_magnitude(self, x: torch.Tensor) -> torch.Tensor:
        """||x||_1 / d, the sum in `ordered.py`'s fixed order (a kernel's one read of `x`, or
        torch ops)."""
        kernel = self.codes.encoder(x)
        if kernel is None:
            return mean_of(ordered_sum(x.abs()), self.numel)
        return mean_of(kernel.feedback_sum(None, x, self._sums()), self.numel)

    def encode_feedback(self, x: torch.Tensor) -> Payload:
        residual = self.state["residual"]
        if self.codes.encoder(x, residual) is None:
            return super().encode_feedback(x)
        return self._encode(x, residual)

    def outgoing(self, grad: torch.Tensor, sent: torch.Tensor | None = None) -> Payload:
        """On CPU (and no `sent`), two kernel passes instead of five: gradient plus residual
        and the sum of their magnitudes in one, then the codes and the new residual in place."""
        x, residual = grad.detach().reshape(-1), self.state["residual"]
        kernel = None if sent is not None or x.numel() != self.numel \
            else self.codes.encoder(x, residual)
        if kernel is None:
            return super().outgoing(grad, sent)
        total = kernel.feedback_sum(x, residual, self._sums())  # residual = x + residual
        return self._encode(residual, residual, mean_of(total, self.numel))

    def _sums(self) -> torch.Tensor:
        """The kernel's work space for a fixed-order sum (one fp32 per chunk), made once."""
        if self._chunk_sums is None:
            self._chunk_sums = torch.empty(sum_chunks(self.numel), device=self.device)
        return self._chunk_sums

    def _encode(self, x: torch.Tensor, residual: torch.Tensor | None,
                scale: torch.Tensor | None = None) -> Payload:
        """The payload of `x`; with `residual`, also `residual = x - decode(payload)` (kernel;
        `residual` may be `x`). `scale`: the mean magnitude of `x` where known."""
        if scale is None:
            scale = self.mean_magnitude(x)
        kernel = self.codes.encoder(x)
        if kernel is None:
            return self.codes.pack(x < 0, scale, self.shape)
        payload, region = self.codes.blank(scale, self.shape, x.device)
        values = None if residual is None else self.values(scale)
        kernel.sign(x, region, values, residual)
        return payload

    def encode_members(self, members: Members) -> None:
        """`outgoing`'s two kernel passes for every member in two calls: each residual plus
        gradient and its magnitudes' sum, then the codes and the new residuals in place."""
        residuals = members.addresses([c.state["residual"] for c in members.comps])
        totals = members.kernel.feedback_sums(members.inputs, residuals, members.layout.lengths)
        scales = mean_of(totals, members.layout.counts)
        members.put_scales(scales)
        members.kernel.sign(residuals, members.layout.lengths, members.codes,
                            self.tables(scales[:, None], members.count).contiguous(), residuals)

    def from_codes(self, codes: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        assert scale is not None
        return signs(codes).mul_(scale)


class MajorityVote(Packed):
    """signSGD with majority vote: d bits a worker, the sign of the vote back."""

    def __init__(self, shape: torch.Size | tuple[int, ...],
                 device: torch.device | None = None) -> None:
        super().__init__("signsgd", shape, device)
        self.codes = ScaledCodes(1, self.numel, scaled=False)

    def encode(self, x: torch.Tensor) -> Payload:
        kernel = self.codes.encoder(x)
        if kernel is None:
            return self.codes.pack(x < 0, None, self.shape)
        payload, region = self.codes.blank(None, self.shape, x.device)
        kernel.sign(x, region)
        return payload

    def encode_members(self, members: Members) -> None:
        members.kernel.sign(members.inputs, members.layout.lengths, members.codes)

    def from_codes(self, codes: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        return signs(codes)

    def finish(self, total: torch.Tensor, count: int) -> torch.Tensor:
        return total.sign_() if count > 1 else total  # one worker's signs are +-1 already


def signs(codes: torch.Tensor) -> torch.Tensor:
    """1 - 2 * code: +1 for a 0 bit, -1 for a 1 bit (fp32)."""
    return codes.to(torch.float32).mul_(-2.0).add_(1.0)


def mean_of(total: torch.Tensor, count: int | torch.Tensor) -> torch.Tensor:
    """A mean from its fp32 sum (fp32 division by the count; a tensor of counts, each at
    least 1, divides a tensor of sums elementwise)."""
    return total / (count if isinstance(count, torch.Tensor) else max(count, 1))
