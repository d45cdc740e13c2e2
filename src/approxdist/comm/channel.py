"""Approximate channel `ber:<rate>@<protected_top_bits>`: bit flips on unprotected code bits (seed 000).

Seed 000 sends the top bits of each fp32 activation on a robust channel (256-QAM) and the
rest on an error-prone one (1024-QAM). `BitErrorChannel.corrupt` reproduces that in
software on any codec's payload: every bit of every value's code except the top
`protected` ones flips independently with probability `rate`. Headers, scales and tables
are never touched. Flip positions are drawn as a Bernoulli process through geometric gaps,
so the cost grows with the number of flips, not with the payload size.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from approxdist.comm.codecs.base import Codec, Payload
from approxdist.errors import SpecError

_BER = re.compile(r"ber:([0-9.eE+-]+)@(\d+)")
CHANNEL_FORMS = "none | ber:<rate>@<protected_top_bits> (e.g. ber:1e-3@5)"


def guard_nonfinite(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Set NaN and +-Inf in `x` to 0 in place; return `x` and how many values were replaced."""
    bad = int(x.numel() - torch.isfinite(x).sum().item()) if x.numel() else 0
    if bad:
        torch.nan_to_num_(x, nan=0.0, posinf=0.0, neginf=0.0)
    return x, bad


class Channel:
    """The identity channel: payloads pass unchanged."""

    spec = "none"

    def corrupt(self, payload: Payload, codec: Codec,
                generator: torch.Generator | None = None) -> Payload:
        return payload

    def guard(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Map non-finite decoded values to 0 (in place) and count them."""
        return guard_nonfinite(x)

    @property
    def is_identity(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<channel {self.spec}>"


@dataclass(frozen=True)
class FlipPlan:
    """Where the unprotected bits of a payload lie: `count` codes of `width` bits from `offset`."""

    offset: int
    count: int
    width: int
    unprotected: int

    @property
    def nbits(self) -> int:
        return self.count * self.unprotected


class BitErrorChannel(Channel):
    """Flips each unprotected code bit with probability `rate`; the top `protected` bits never."""

    def __init__(self, rate: float, protected: int, seed: int = 0) -> None:
        if not 0.0 <= rate <= 1.0 or math.isnan(rate):
            raise SpecError(f"bit error rate {rate} must lie in [0, 1]; e.g. ber:1e-3@5")
        if protected < 0:
            raise SpecError(f"protected bits {protected} must be >= 0; e.g. ber:1e-3@5")
        self.rate = rate
        self.protected = protected
        self.spec = f"ber:{rate:g}@{protected}"
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def is_identity(self) -> bool:
        return self.rate == 0.0

    def plan(self, payload: Payload, codec: Codec) -> FlipPlan:
        n, width = payload.numel, codec.code_bits
        return FlipPlan(codec.codes_offset(n), n, width, max(width - self.protected, 0))

    def corrupt(self, payload: Payload, codec: Codec,
                generator: torch.Generator | None = None) -> Payload:
        """A new payload with bit flips; `generator` (or the channel's own, seeded) drives them."""
        plan = self.plan(payload, codec)
        if self.rate == 0.0 or plan.nbits == 0:
            return payload
        gen = self.generator if generator is None else generator
        data = payload.data.clone()
        for flips in flip_chunks(plan.nbits, self.rate, gen):
            _apply(data, plan, flips.to(data.device))
        return Payload(data, payload.shape)


#: most flip positions drawn at once (bounds memory at high rates)
MAX_DRAW = 1 << 22


def flip_chunks(nbits: int, rate: float, gen: torch.Generator) -> Iterator[torch.Tensor]:
    """Sorted int64 indices in [0, nbits) where a Bernoulli(rate) trial succeeded, in chunks.

    Successes are found by cumulative sums of geometric gaps, so the work is proportional
    to the number of flips.
    """
    if rate >= 1.0:
        for lo in range(0, nbits, MAX_DRAW):
            yield torch.arange(lo, min(lo + MAX_DRAW, nbits), device=gen.device)
        return
    expected = nbits * rate
    draw = min(MAX_DRAW, int(expected + 6.0 * math.sqrt(expected) + 16))
    last = -1
    while last < nbits:
        gaps = torch.empty(draw, dtype=torch.float64, device=gen.device)
        gaps.geometric_(rate, generator=gen).clamp_(max=float(nbits + 1))  # tiny rates: no overflow
        pos = gaps.cumsum_(0).to(torch.int64) + last
        last = int(pos[-1])
        yield pos[pos < nbits] if last >= nbits else pos


def flip_positions(nbits: int, rate: float, gen: torch.Generator) -> torch.Tensor:
    """All flip positions of `flip_chunks` in one tensor."""
    parts = list(flip_chunks(nbits, rate, gen))
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


def _apply(data: torch.Tensor, plan: FlipPlan, flips: torch.Tensor) -> None:
    """XOR the flips (indices among unprotected bits) into the payload bytes, in place."""
    code, bit = flips // plan.unprotected, flips % plan.unprotected
    stream = code * plan.width + bit  # unprotected bits are the low bits of each code
    byte = stream // 8 + plan.offset
    mask = torch.ones_like(stream).bitwise_left_shift_(stream % 8)
    uniq, inverse = torch.unique_consecutive(byte, return_inverse=True)
    acc = torch.zeros(uniq.numel(), dtype=torch.int64, device=data.device)
    acc.index_add_(0, inverse, mask)  # distinct bits of one byte: the sum is their OR
    data[uniq] ^= acc.to(torch.uint8)


def get_channel(spec: str | None, seed: int = 0) -> Channel:
    """The channel for `spec`: None or "none" is the identity; "ber:<rate>@<bits>" flips bits."""
    if spec is None or spec.strip().lower() in ("", "none"):
        return Channel()
    match = _BER.fullmatch(spec.strip().lower())
    if not match:
        raise SpecError(f"unknown channel spec {spec!r}; valid: {CHANNEL_FORMS}")
    try:
        rate = float(match.group(1))
    except ValueError:
        raise SpecError(f"bit error rate {match.group(1)!r} in {spec!r} is not a number; "
                        f"e.g. ber:1e-3@5") from None
    return BitErrorChannel(rate, int(match.group(2)), seed)
