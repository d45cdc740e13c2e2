"""8-bit float codecs `fp8-e4m3` and `fp8-e5m2` with a per-tensor power-of-two scale (seed 004 "fp8").

Before the cast every value is multiplied by 2**-k, the k that puts the largest finite
magnitude into the top binade of the format (448 for e4m3, 57344 for e5m2), so small
gradients are not flushed to zero. A power of two is exact: the decoded value is
torch's own cast of x * 2**-k, times 2**k. k travels as an int32 in 4 metadata bytes.
Decoding is a lookup in the 256 scaled values of the format (torch's e4m3 -> fp32 cast
is slow on CPU).
"""

from __future__ import annotations

import math

import torch

from approxdist.comm.codecs.framed import FramedCodec, typed
from approxdist.comm.codecs.lut import CachedLut, LutDecoder, LutTables

_MIN_K, _MAX_K = -126, 127


def scale_exponent(amax: float, fmax: float) -> int:
    """The k with amax * 2**-k in (fmax/2, fmax]; 0 for a zero or non-finite amax."""
    if not math.isfinite(amax) or amax <= 0.0:
        return 0
    mant, exp = math.frexp(amax / fmax)  # amax/fmax = mant * 2**exp, mant in [0.5, 1)
    k = exp if mant > 0.5 else exp - 1
    return max(_MIN_K, min(_MAX_K, k))


def finite_amax(x: torch.Tensor) -> float:
    """Largest finite |x| (0.0 for an empty or all non-finite tensor)."""
    if x.numel() == 0:
        return 0.0
    lo, hi = torch.aminmax(x)
    amax = max(-float(lo), float(hi))
    if math.isfinite(amax):
        return amax
    finite = x[torch.isfinite(x)]  # rare path: NaN or Inf present
    return float(finite.abs().max()) if finite.numel() else 0.0


class Fp8Codec(FramedCodec):
    """Scaled cast to an 8-bit float format; the code of a value is its fp8 byte."""

    def __init__(self, spec: str, dtype: torch.dtype) -> None:
        super().__init__(spec)
        self.family = spec
        self.dtype = dtype
        self.fmax = float(torch.finfo(dtype).max)
        self._lut = LutDecoder(8)
        self._base = CachedLut(8, self._code_values)

    @property
    def code_bits(self) -> int:
        return 8

    def meta_nbytes(self, numel: int) -> int:
        return 4

    def _code_values(self) -> torch.Tensor:
        return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(self.dtype).float()

    def _prepare(self, x: torch.Tensor, meta: torch.Tensor) -> object:
        k = scale_exponent(finite_amax(x), self.fmax)
        meta.copy_(torch.tensor([k], dtype=torch.int32).view(torch.uint8))
        return k

    def _load(self, meta: torch.Tensor) -> object:
        k = int(typed(meta, torch.int32)[0])
        return self._lut.tables(self._base.values(meta.device) * 2.0 ** k)

    def _encode_chunk(self, x: torch.Tensor, codes: torch.Tensor, state: object) -> None:
        assert isinstance(state, int)
        out = codes.view(self.dtype)
        if state == 0:
            out.copy_(x)
            return
        tmp = self.work.get("scaled", x.numel(), torch.float32, x.device)
        torch.mul(x, 2.0 ** -state, out=tmp)
        out.copy_(tmp)

    def _decode_chunk(self, codes: torch.Tensor, y: torch.Tensor, state: object) -> None:
        assert isinstance(state, LutTables)
        self._lut.decode(codes, y.numel(), y, self.work, state)


def fp8_e4m3() -> Fp8Codec:
    return Fp8Codec("fp8-e4m3", torch.float8_e4m3fn)


def fp8_e5m2() -> Fp8Codec:
    return Fp8Codec("fp8-e5m2", torch.float8_e5m2)
