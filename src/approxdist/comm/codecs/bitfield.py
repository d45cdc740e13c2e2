"""Bit-field codecs `bits:s<0|1>e<N|A+B>m<M>`: keep chosen fp32 bits, zero the rest (seed 000 §4.3-4.4).

The code of a value is its kept bits in their fp32 order (sign, exponent top A, exponent
bottom B, mantissa top M), packed with `bitpack`. The receiver puts them back in place
and fills every unsent bit with 0, as seed 000 does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from approxdist.comm.codecs.bitpack import as_signed, code_dtype, pack_codes, unpack_codes
from approxdist.comm.codecs.framed import FramedCodec
from approxdist.comm.codecs.lut import CachedLut
from approxdist.errors import SpecError
from approxdist.kernels.bitfield import BitKernel
from approxdist.kernels.slot import KernelSlot


@dataclass(frozen=True)
class Run:
    """Kept fp32 bits [lo, lo+length) that land at code bits [pos, pos+length)."""

    lo: int
    length: int
    pos: int

    @property
    def mask(self) -> int:
        return ((1 << self.length) - 1) << self.pos


@dataclass(frozen=True)
class BitLayout:
    """Which fp32 bits a `bits:` spec keeps."""

    sign: int
    top: int
    bottom: int
    mantissa: int

    def __post_init__(self) -> None:
        spec = f"bits:s{self.sign}e{self.top}{f'+{self.bottom}' if self.bottom else ''}" \
               f"m{self.mantissa}"
        if self.sign not in (0, 1) or self.top < 0 or self.bottom < 0 or self.mantissa < 0:
            raise SpecError(f"bad bit-field {spec!r}: counts must be >= 0 and sign 0 or 1")
        if self.top + self.bottom > 8:
            raise SpecError(f"bad bit-field {spec!r}: at most 8 exponent bits "
                            f"(got {self.top}+{self.bottom}); e.g. bits:s0e2+2m0")
        if self.mantissa > 23:
            raise SpecError(f"bad bit-field {spec!r}: at most 23 mantissa bits "
                            f"(got {self.mantissa}); e.g. bits:s1e8m7")
        if self.width == 0:
            raise SpecError(f"bad bit-field {spec!r}: keeps no bit; keep at least one, "
                            f"e.g. bits:s0e1m0")

    @property
    def width(self) -> int:
        return self.sign + self.top + self.bottom + self.mantissa

    @property
    def spec(self) -> str:
        exp = f"{self.top}+{self.bottom}" if self.bottom and self.top + self.bottom < 8 \
            else f"{self.top + self.bottom}"
        return f"bits:s{self.sign}e{exp}m{self.mantissa}"

    def kept_bits(self) -> list[int]:
        """fp32 bit positions kept, highest first."""
        bits = [31] if self.sign else []
        bits += [30 - i for i in range(self.top)]
        bits += [22 + self.bottom - i for i in range(self.bottom)]
        bits += [22 - i for i in range(self.mantissa)]
        return sorted(set(bits), reverse=True)

    def runs(self) -> list[Run]:
        """Maximal runs of adjacent kept bits, lowest first."""
        kept = sorted(self.kept_bits())
        runs: list[Run] = []
        start, pos = kept[0], 0
        for prev, bit in zip(kept, kept[1:] + [None]):
            if bit != prev + 1:
                runs.append(Run(start, prev - start + 1, pos))
                pos += prev - start + 1
                if bit is not None:
                    start = bit
        return runs


class BitFieldCodec(FramedCodec):
    """Sends the kept bits of each fp32 value, packed; unsent bits decode as 0.

    On CPU, encode, decode and decode-and-add run as one fused C pass each
    (`approxdist.kernels`, 3-5x fewer cycles than the chain of torch ops) when the kernels
    could be built; the torch ops below are the fallback and the reference, bit for bit.
    """

    family = "bits"

    def __init__(self, layout: BitLayout, use_kernels: bool = True) -> None:
        super().__init__(layout.spec)
        self.use_kernels = use_kernels  # False: always the torch ops (a reference, a benchmark)
        self.layout = layout
        self.runs = layout.runs()
        self._lut = CachedLut(layout.width, self._code_values) if layout.width <= 16 else None
        self._top16: dict[torch.device, torch.Tensor] = {}
        kept = sum(1 << b for b in layout.kept_bits())
        self._mask = kept - (1 << 32) if kept >= 1 << 31 else kept  # kept bits, signed int32
        self._kernels: KernelSlot[BitKernel] = KernelSlot()

    def _kernel(self, *tensors: torch.Tensor) -> BitKernel | None:
        """The fused kernel if it can take these tensors, else None (use torch ops)."""
        return self._cpu_kernel() if BitKernel.usable(*tensors) else None

    def _cpu_kernel(self) -> BitKernel | None:
        if self.lossless or not self.use_kernels:
            return None
        return self._kernels.get(lambda: BitKernel.create(
            [(r.lo, r.length, r.pos) for r in self.runs], self.layout.width))

    def _fused_on(self, device: torch.device) -> bool:
        return device.type == "cpu" and self._cpu_kernel() is not None

    @property
    def code_bits(self) -> int:
        return self.layout.width

    def roundtrip(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Decoding keeps the sent bits in place and zeroes the rest: one mask, no codes."""
        x = x.detach().float().contiguous()
        out = torch.empty_like(x) if out is None else out
        torch.bitwise_and(x.view(torch.int32), self._mask, out=out.view(torch.int32))
        return out

    @property
    def lossless(self) -> bool:
        return self.layout.width == 32

    def codes_to_bits(self, codes: torch.Tensor) -> torch.Tensor:
        """int32 fp32 bit patterns of int64/int32 `codes` (unsent bits 0); a reference helper."""
        out = torch.zeros_like(codes, dtype=torch.int32)
        for run in self.runs:
            part = ((codes >> run.pos) & ((1 << run.length) - 1)).to(torch.int64) << run.lo
            out |= _wrap32(part)
        return out

    def _code_values(self) -> torch.Tensor:
        codes = torch.arange(1 << self.layout.width, dtype=torch.int64)
        return self.codes_to_bits(codes).view(torch.float32)

    def _encode_chunk(self, x: torch.Tensor, codes: torch.Tensor, state: object) -> None:
        xi = x.view(torch.int32)
        if self.lossless:  # the encode regions are 4-byte aligned
            codes.view(torch.int32).copy_(xi)
            return
        kernel = self._kernel(x, codes)
        if kernel is not None:
            kernel.encode(x, codes)
            return
        if self.runs[0].lo >= 16 and torch.get_num_threads() > 1:
            # every kept bit is in the top half: one lookup per value. Fewer ops than the
            # arithmetic (which is cheaper per value) win when ops end in thread barriers.
            pack_codes(self._codes_by_lookup(x, codes), self.layout.width, codes, self.work)
            return
        pack_codes(self._codes(xi), self.layout.width, codes, self.work)

    def _codes_by_lookup(self, x: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Codes from a 65536-entry table indexed by the top 16 bits (sign, exponent, 7 mantissa).

        For 8-bit codes the lookup writes straight into the payload.
        """
        n, dev = x.numel(), x.device
        lut = self._top16.get(dev)
        if lut is None:
            top = torch.arange(1 << 16, dtype=torch.int64) << 16
            lut = self._codes(_wrap32(top)).clone().to(dev)
            self._top16[dev] = lut
        index = self.work.get("top16", n, torch.int32, dev).copy_(x.view(torch.uint16)[1::2])
        code = codes if lut.dtype == torch.uint8 and self.layout.width == 8 \
            else self.work.get("code", n, lut.dtype, dev)
        return torch.index_select(lut, 0, index, out=code)

    def _codes(self, xi: torch.Tensor) -> torch.Tensor:
        """The codes of the int32 view `xi`, in a work buffer of dtype `code_dtype(width)`.

        One shift brings the kept span down to bit 0 (narrowed to the smallest dtype that
        holds it); each run of kept bits is then masked and moved into place on that dtype.
        """
        n, dev, lo = xi.numel(), xi.device, self.runs[0].lo
        span = self.runs[-1].lo + self.runs[-1].length - lo
        window = self.work.get("window32", n, torch.int32, dev)
        torch.bitwise_right_shift(xi, lo, out=window)
        if code_dtype(span) != torch.int32:
            window = self.work.get("window", n, code_dtype(span), dev).copy_(window)
        bits = window.element_size() * 8
        code = self.work.get("code", n, window.dtype, dev)
        torch.bitwise_and(window, as_signed(self.runs[0].mask, bits), out=code)
        for run in self.runs[1:]:
            window.bitwise_right_shift_(run.lo - lo - run.pos)
            window.bitwise_and_(as_signed(run.mask, bits))
            code.bitwise_or_(window)
        out_dtype = code_dtype(self.layout.width)
        if out_dtype != code.dtype:
            code = self.work.get("code_small", n, out_dtype, dev).copy_(code)
        return code

    def _decode_add_chunk(self, codes: torch.Tensor, y: torch.Tensor, state: object) -> None:
        kernel = self._kernel(codes, y)
        if kernel is not None:
            kernel.decode_add(codes, y)
        else:
            super()._decode_add_chunk(codes, y, state)

    def _decode_chunk(self, codes: torch.Tensor, y: torch.Tensor, state: object) -> None:
        n = y.numel()
        kernel = self._kernel(codes, y)
        if kernel is not None:
            kernel.decode(codes, y)
            return
        if self._lut is not None:
            self._lut.decode(codes, n, y, self.work)
            return
        code = unpack_codes(codes, self.layout.width, n, self.work)
        out = y.view(torch.int32)
        if self.lossless:
            out.copy_(code)
            return
        out.zero_()
        tmp = self.work.get("dec_tmp", n, torch.int32, y.device)
        for run in self.runs:
            torch.bitwise_right_shift(code, run.pos, out=tmp)
            tmp.bitwise_and_((1 << run.length) - 1).bitwise_left_shift_(run.lo)
            out.bitwise_or_(tmp)


def _wrap32(v: torch.Tensor) -> torch.Tensor:
    """int64 values holding 32-bit patterns -> int32 with the same bits."""
    v = v & 0xFFFFFFFF
    return torch.where(v >= 1 << 31, v - (1 << 32), v).to(torch.int32)


def parse_bits(sign: str, exponent: str, mantissa: str) -> BitFieldCodec:
    """Build from the groups of `bits:s<S>e<N|A+B>m<M>`."""
    top, _, bottom = exponent.partition("+")
    return BitFieldCodec(BitLayout(int(sign), int(top), int(bottom or 0), int(mantissa)))
