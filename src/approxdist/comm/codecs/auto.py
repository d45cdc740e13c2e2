"""Data-aware bit-field `bits:auto<K>`: send the K sign/exponent bits that vary (seed 000 §4.4, Fig. 5).

Seed 000 picked "top 2 + bottom 2 exponent bits" by reading a histogram. This codec does
it by itself: from the histogram of the 9-bit sign+exponent field of observed values it
chooses the K bits to send and constants for the other bits with the least expected
absolute error (`approxdist.comm.exponents.best_fields`). The receiver restores the
constant bits with their observed values instead of zeros, so a value whose unsent bits
match keeps its exact sign and exponent; the mantissa is not sent and decodes as 0
(value = +-2**(e-127)). A value whose unsent bits do not match gets the code of the
representable value nearest to it (e.g. 0 for a small value when 0 is representable).

Calibration and re-calibration: the first `encode` calibrates on that tensor (a strided
sample of at most 65536 values). Every later `encode` measures the covered fraction on a
sample of at most 4096 values and re-calibrates on the current tensor when it has fallen
more than `tolerance` (default 0.01) below the fraction measured at calibration.
`calibrate(x)` forces it. The choice travels in 4 metadata bytes, so the receiver needs
no state of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from approxdist.comm.codecs.bitpack import code_dtype, pack_codes
from approxdist.comm.codecs.framed import FramedCodec, typed
from approxdist.comm.codecs.lut import LutDecoder, LutTables
from approxdist.comm.exponents import FIELD_BITS, best_fields, nearest, spread
from approxdist.errors import CodecError, SpecError

CALIBRATION_SAMPLE = 1 << 16
CHECK_SAMPLE = 1 << 12


def sample(x: torch.Tensor, size: int) -> torch.Tensor:
    """An evenly strided sample of at most `size` values of flat `x`."""
    return x[:: max(1, -(-x.numel() // size))]


def field_counts(x: torch.Tensor) -> torch.Tensor:
    """Histogram (512 bins, CPU) of the sign+exponent field of fp32 `x`."""
    fields = (x.view(torch.int32) >> 23) & 0x1FF
    return torch.bincount(fields.to(torch.int64), minlength=512).cpu()


@dataclass(frozen=True)
class FieldChoice:
    """Which of the 9 sign+exponent bits are sent, and the value of the others."""

    sent: int
    const: int

    def representable(self) -> torch.Tensor:
        """The 2**K fields the receiver can produce, indexed by code (int64)."""
        bits = [b for b in range(FIELD_BITS) if self.sent >> b & 1]
        return spread(torch.arange(1 << len(bits), dtype=torch.int64), bits) \
            | (self.const & ~self.sent)

    def encoder_lut(self) -> torch.Tensor:
        """Code for each of the 512 fields: exact where representable, else nearest."""
        return nearest(torch.arange(512, dtype=torch.int64), self.representable())

    def values(self) -> torch.Tensor:
        """fp32 value of each code (mantissa 0)."""
        return (self.representable() << 23).to(torch.int32).view(torch.float32)

    def to_meta(self) -> torch.Tensor:
        return torch.tensor([self.sent, self.const], dtype=torch.int16).view(torch.uint8)


class AutoBitsCodec(FramedCodec):
    """`bits:auto<K>`: K bits per value chosen from the observed sign+exponent histogram."""

    family = "auto"

    def __init__(self, k: int, tolerance: float = 0.01) -> None:
        if not 1 <= k <= FIELD_BITS:
            raise SpecError(f"bits:auto{k}: K must be 1..{FIELD_BITS} (bits chosen among sign "
                            f"and 8 exponent bits); e.g. bits:auto4")
        super().__init__(f"bits:auto{k}")
        self.k = k
        self.tolerance = tolerance
        self.choice: FieldChoice | None = None
        self.coverage = 0.0
        self.calibrations = 0
        self._lut = LutDecoder(k)
        self._enc: dict[torch.device, torch.Tensor] = {}

    @property
    def code_bits(self) -> int:
        return self.k

    def meta_nbytes(self, numel: int) -> int:
        return 4

    def calibrate(self, x: torch.Tensor) -> FieldChoice:
        """Choose the sent bits from (a sample of) `x` now."""
        counts = field_counts(sample(x.detach().reshape(-1).float(), CALIBRATION_SAMPLE))
        sent, const, cover = best_fields(counts, self.k)
        self.choice, self.coverage = FieldChoice(sent, const), cover
        self.calibrations += 1
        self._enc.clear()
        return self.choice

    def covered(self, x: torch.Tensor) -> float:
        """Fraction of a small sample of `x` whose sign and exponent the current choice keeps."""
        assert self.choice is not None
        counts = field_counts(sample(x, CHECK_SAMPLE))
        fields = torch.arange(512)
        ok = (fields & ~self.choice.sent) == (self.choice.const & ~self.choice.sent)
        total = int(counts.sum())
        return float(counts[ok].sum()) / total if total else 1.0

    def _prepare(self, x: torch.Tensor, meta: torch.Tensor) -> object:
        if self.choice is None or self.covered(x) < self.coverage - self.tolerance:
            self.calibrate(x)
        assert self.choice is not None
        meta.copy_(self.choice.to_meta().to(meta.device))
        lut = self._enc.get(x.device)
        if lut is None:  # indexed by the top 16 bits: the field is bits 7..15 of them
            by_field = self.choice.encoder_lut().to(code_dtype(self.k))
            lut = by_field[torch.arange(1 << 16) >> 7].to(x.device)
            self._enc[x.device] = lut
        return lut

    def _load(self, meta: torch.Tensor) -> object:
        sent, const = (int(v) for v in typed(meta, torch.int16).cpu())
        if bin(sent & 0x1FF).count("1") != self.k or sent & ~0x1FF:
            raise CodecError(f"payload for {self.spec!r} has a corrupt field choice "
                             f"(mask {sent:#x}); was it made by another codec?")
        values = FieldChoice(sent, const).values().to(meta.device)
        return self._lut.tables(values)

    def _encode_chunk(self, x: torch.Tensor, codes: torch.Tensor, state: object) -> None:
        assert isinstance(state, torch.Tensor)
        n, dev = x.numel(), x.device
        top = self.work.get("top16", n, torch.int32, dev).copy_(x.view(torch.uint16)[1::2])
        code = self.work.get("code", n, state.dtype, dev)
        torch.index_select(state, 0, top, out=code)
        pack_codes(code, self.k, codes, self.work)

    def _decode_chunk(self, codes: torch.Tensor, y: torch.Tensor, state: object) -> None:
        assert isinstance(state, LutTables)
        self._lut.decode(codes, y.numel(), y, self.work, state)


def parse_auto(k: str) -> AutoBitsCodec:
    return AutoBitsCodec(int(k))
