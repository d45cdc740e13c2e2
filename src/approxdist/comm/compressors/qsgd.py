"""QSGD (Alistarh et al., NeurIPS 2017): unbiased stochastic quantisation to s levels.

Q_s(v)_i = ||v||_2 * sign(v_i) * (l_i + b_i) / s, with a_i = s |v_i| / ||v||_2,
l_i = floor(a_i) and b_i = 1 with probability a_i - l_i (else 0): E[Q_s(v)] = v. A worker
sends the norm (fp32) and one code per value, sign * level + s in [0, 2s], bit-packed in
ceil(log2(2s + 1)) bits. The norm differs between workers, so payloads are gathered. The
draws come from the compressor's counter-based stream (`stream.py`); a zero or non-finite
norm sends level 0 everywhere. The norm is the root of the squares' sum in `ordered.py`'s
fixed order, so its bits do not depend on the thread count and the kernel (which splits it
over the threads, `CompressKernel.square_sum`) and torch ops give the same payload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from approxdist.comm.codecs.base import Payload
from approxdist.comm.compressors.ordered import ordered_sum
from approxdist.comm.compressors.packed import Packed, ScaledCodes
from approxdist.comm.compressors.stream import Stream, next_keys, uniform
from approxdist.errors import SpecError

if TYPE_CHECKING:
    from approxdist.comm.compressors.packed_bucket import Members

MAX_LEVELS = 1 << 15


class QSGD(Packed):
    """s-level QSGD with its own random stream (seeded per worker), no error feedback."""

    def __init__(self, levels: int, shape: torch.Size | tuple[int, ...], *, seed: int = 0,
                 device: torch.device | None = None) -> None:
        super().__init__(f"qsgd:{levels}", shape, device)
        self.levels = levels
        self.codes = ScaledCodes((2 * levels).bit_length(), self.numel)
        self.stream = Stream(seed, self.state)

    def encode(self, x: torch.Tensor) -> Payload:
        return self.encode_keyed(x, self.stream.next_key())

    def encode_keyed(self, x: torch.Tensor, key: int) -> Payload:
        """The payload of `x` with the draws of the step keyed `key`."""
        kernel = self.codes.encoder(x)
        squares = ordered_sum(x * x) if kernel is None else kernel.square_sum(x)
        norm = squares.sqrt()
        scale = self.levels / norm
        if kernel is None or not _positive(norm) or not _positive(scale):
            return self.codes.pack(self.reference_codes(x, norm, key), norm, self.shape)
        payload, region = self.codes.blank(norm, self.shape, x.device)
        kernel.qsgd(x, float(scale), self.levels, key, self.codes.width, region)
        return payload

    def reference_codes(self, x: torch.Tensor, norm: torch.Tensor, key: int) -> torch.Tensor:
        """The codes by torch ops: a = |x| * (s / norm) (|x| / norm * s where s / norm
        overflows; 0 where the norm is zero or not finite)."""
        s = self.levels
        if not _positive(norm):
            a = torch.zeros_like(x)
        else:
            scale = s / norm
            a = x.abs().mul_(scale) if _positive(scale) else x.abs().div_(norm).mul_(s)
        low = a.floor()
        level = low + (uniform(key, x.numel(), x.device) < a - low)
        level.clamp_(max=s)
        return torch.where(x < 0, -level, level).add_(s)

    def encode_members(self, members: Members) -> None:
        """Every member's norm in one kernel call, its scale by `encode`'s torch ops on all of
        them at once, every member's codes in one more call (each with its own draws); a member
        whose norm or scale is zero or not finite by its torch path."""
        own = [c for c in members.comps if isinstance(c, QSGD)]
        assert len(own) == members.count, "a bucket holds one compressor class"
        keys = next_keys([c.stream for c in own])
        lengths = members.layout.lengths
        norms = members.kernel.square_sums(members.inputs, lengths).sqrt()
        scales = self.levels / norms
        kept = positive(norms) & positive(scales)
        members.put_scales(norms)
        members.kernel.qsgd(members.inputs, lengths, scales, self.levels, keys,
                            self.codes.width, members.codes_where(kept))
        members.by_torch(~kept, lambda i, x: own[i].encode_keyed(x, keys[i]))

    def from_codes(self, codes: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        assert scale is not None
        return codes.sub_(self.levels).to(torch.float32).mul_(scale / self.levels)


def positive(values: torch.Tensor) -> torch.Tensor:
    """Where `values` are finite and above zero."""
    return torch.isfinite(values) & (values > 0)


def _positive(value: torch.Tensor) -> bool:
    """Whether a 0-d tensor is finite and above zero."""
    return bool(positive(value))


def parse_levels(text: str | None) -> int:
    """`qsgd:<s>` -> s in [2, 2**15]."""
    if text is None or not text.isdigit() or not 2 <= int(text) <= MAX_LEVELS:
        raise SpecError(f"qsgd levels {text!r} must be an integer in [2, {MAX_LEVELS}] (qsgd:1 "
                        f"keeps only sign and norm: use terngrad); e.g. qsgd:16 (6 bits a value)")
    return int(text)
