"""Table-N codec `table<N>`: sign + (N-1)-bit index into per-tensor percentile magnitudes (seed 004).

The table holds T = 2**(N-1) magnitudes, the 99k/T-th percentiles of |x| (k = 1..T), and
travels with the payload (4T bytes after the header). Each value becomes its sign bit
(the code's top bit) and the index of the nearest table magnitude; the decision
thresholds are the fp32 midpoints between neighbouring entries (|x| >= midpoint rounds
up). Encoding avoids `bucketize`: the top 16 bits of the fp32 pattern (sign, exponent,
7 mantissa bits) index a 65536-entry table of "index at the start of this bin" plus "the
one threshold inside this bin"; a single compare finishes the job. Bins holding several
distinct thresholds (rare) are resolved exactly with `searchsorted` on their values only.

On CPU the percentile sample, encode, decode and decode-and-add run as fused C kernels
(`approxdist.kernels.table`) when the kernels could be built; the torch ops are the
fallback and the reference, bit for bit (`use_kernels=False` forces them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from approxdist.comm.codecs.bitpack import code_dtype, pack_codes
from approxdist.comm.codecs.framed import FramedCodec, typed
from approxdist.comm.codecs.lut import LutDecoder, LutTables
from approxdist.errors import SpecError
from approxdist.kernels.slot import KernelSlot
from approxdist.kernels.table import TableKernel

MAX_N = 12
#: percentiles are estimated on an evenly strided sample of at most this many values
#: (small enough that torch runs the sampling ops on one thread: no barrier costs)
SAMPLE = 1 << 14
#: tensors smaller than this are encoded by binary search instead of the 65536-bin tables
SMALL = 1 << 18


def percentile_table(x: torch.Tensor, entries: int,
                     kernel: TableKernel | None = None) -> torch.Tensor:
    """The `entries` magnitudes of Table-N: 99k/entries-th percentiles of finite |x| (CPU fp32).

    Linear interpolation between order statistics, as `torch.quantile`, on an evenly
    strided sample of at most `SAMPLE` values, so it is exact for tensors up to that size.
    `kernel` draws and sorts the sample in one C pass (same values) when it can take `x`.
    """
    flat = x.reshape(-1)
    step = max(1, -(-flat.numel() // SAMPLE))  # ceil: the sample spans the whole tensor
    if kernel is not None and flat.dtype == torch.float32 and kernel.usable(flat):
        mag = kernel.sorted_sample(flat, step)
    else:
        mag = flat[::step].detach().abs().cpu()
        mag = torch.sort(mag[torch.isfinite(mag)]).values
    if mag.numel() == 0:
        return torch.zeros(entries, dtype=torch.float32)
    pos = torch.arange(1, entries + 1, dtype=torch.float64) * (0.99 / entries) * (mag.numel() - 1)
    below = pos.floor().long()
    above = pos.ceil().long()
    return torch.lerp(mag[below].double(), mag[above].double(), pos - below).float()


@dataclass
class EncoderTables:
    """Lookup tables of one payload's encoder, indexed by the top 16 bits of the fp32 pattern."""

    base: torch.Tensor  # code at the start of the bin (sign bit + index)
    above: torch.Tensor  # int32 pattern: values above it get index + 1
    mids: torch.Tensor  # int32 patterns of the midpoints, for the exact slow path
    multi: torch.Tensor | None  # bool per bin: several distinct thresholds inside


def _midpoints(table: torch.Tensor) -> torch.Tensor:
    """int32 bit patterns of the fp32 midpoints between neighbouring table entries."""
    return ((table[:-1] + table[1:]) / 2).view(torch.int32)


def encoder_tables(table: torch.Tensor, bits: int, device: torch.device) -> EncoderTables:
    """Build the 65536-bin lookup tables for `table` (sorted fp32 magnitudes) and `bits`."""
    mids = _midpoints(table)
    start = torch.arange(1 << 15, dtype=torch.int32) << 16
    end = start | 0xFFFF
    lo = torch.searchsorted(mids, start, right=True, out_int32=True)
    hi = torch.searchsorted(mids, end, right=True, out_int32=True)
    first = mids[lo.clamp(max=max(mids.numel() - 1, 0))] if mids.numel() else end
    above = torch.where(hi > lo, first - 1, end)
    multi = (hi > lo + 1) & (mids[(hi - 1).clamp(min=0)] != first) if mids.numel() else None
    base = torch.empty(1 << 16, dtype=code_dtype(bits))
    base[: 1 << 15] = lo
    base[1 << 15:] = lo | (1 << (bits - 1))  # the sign bit is the code's top bit
    above32 = torch.empty(1 << 16, dtype=torch.int32)
    above32[: 1 << 15] = above
    above32[1 << 15:] = above | -(1 << 31)  # negative bins: patterns with the sign bit
    flags = None
    if multi is not None and bool(multi.any()):
        flags = torch.cat([multi, multi]).to(device)
    return EncoderTables(base.to(device), above32.to(device), mids.to(device), flags)


@dataclass
class KernelEncoder:
    """Encoder state of the fused kernel: the int32 patterns of the decision thresholds."""

    mids: torch.Tensor


class TableCodec(FramedCodec):
    """Table-N: N bits per value plus a table of 2**(N-1) fp32 magnitudes per tensor."""

    family = "table"

    def __init__(self, bits: int, use_kernels: bool = True) -> None:
        if not 1 <= bits <= MAX_N:
            raise SpecError(f"table{bits}: N must be 1..{MAX_N} (sign + N-1 index bits); "
                            f"e.g. table2 or table4")
        super().__init__(f"table{bits}")
        self.bits = bits
        self.entries = 1 << (bits - 1)
        self._lut = LutDecoder(bits)
        self.use_kernels = use_kernels  # False: always the torch ops (a reference, a benchmark)
        self._kernels: KernelSlot[TableKernel] = KernelSlot()

    def _kernel(self, *tensors: torch.Tensor) -> TableKernel | None:
        """The fused kernel if it can take these tensors, else None (use torch ops)."""
        return self._cpu_kernel() if TableKernel.usable(*tensors) else None

    def _cpu_kernel(self) -> TableKernel | None:
        if not self.use_kernels:
            return None
        return self._kernels.get(lambda: TableKernel.create(self.bits))

    def _fused_on(self, device: torch.device) -> bool:
        return device.type == "cpu" and self._cpu_kernel() is not None

    @property
    def code_bits(self) -> int:
        return self.bits

    def meta_nbytes(self, numel: int) -> int:
        return 4 * self.entries

    def _prepare(self, x: torch.Tensor, meta: torch.Tensor) -> object:
        kernel = self._kernel(x)
        table = percentile_table(x, self.entries, kernel)
        meta.copy_(table.view(torch.uint8).to(meta.device))
        if kernel is not None:
            return KernelEncoder(_midpoints(table).contiguous())
        if x.numel() < SMALL:  # building the 65536-bin tables would cost more than it saves
            return _midpoints(table).to(x.device)
        return encoder_tables(table, self.bits, x.device)

    def _load(self, meta: torch.Tensor) -> object:
        table = typed(meta, torch.float32)
        values = torch.cat([table, -table])
        return self._lut.tables(values)

    def _encode_chunk(self, x: torch.Tensor, codes: torch.Tensor, state: object) -> None:
        if isinstance(state, KernelEncoder):
            kernel = self._kernel(x, codes)
            assert kernel is not None  # `_prepare` chose the kernel for these tensors
            kernel.encode(x, state.mids, codes)
            return
        if isinstance(state, torch.Tensor):
            pack_codes(self._search(x.view(torch.int32), state), self.bits, codes, self.work)
            return
        assert isinstance(state, EncoderTables)
        n, dev = x.numel(), x.device
        top = self.work.get("top16", n, torch.int32, dev).copy_(x.view(torch.uint16)[1::2])
        code = self.work.get("code", n, state.base.dtype, dev)
        torch.index_select(state.base, 0, top, out=code)
        above = self.work.get("above", n, torch.int32, dev)
        torch.index_select(state.above, 0, top, out=above)
        step = self.work.get("step", n, torch.bool, dev)
        torch.gt(x.view(torch.int32), above, out=step)
        code.add_(step.view(torch.uint8) if code.dtype == torch.uint8 else step)
        if state.multi is not None:
            self._exact(x, top, code, state)
        pack_codes(code, self.bits, codes, self.work)

    def _exact(self, x: torch.Tensor, top: torch.Tensor, code: torch.Tensor,
               state: EncoderTables) -> None:
        """Exact index for values in bins with several distinct thresholds (rare)."""
        assert state.multi is not None
        where = state.multi[top].nonzero().view(-1)
        if where.numel() == 0:
            return
        code[where] = self._search(x.view(torch.int32)[where], state.mids)

    def _search(self, xi: torch.Tensor, mids: torch.Tensor) -> torch.Tensor:
        """Codes of int32 fp32 patterns `xi` by binary search in the midpoint patterns."""
        index = torch.searchsorted(mids, xi & 0x7FFFFFFF, right=True, out_int32=True)
        sign = (xi < 0).to(torch.int32) << (self.bits - 1)
        return (index | sign).to(code_dtype(self.bits))

    def _decode_chunk(self, codes: torch.Tensor, y: torch.Tensor, state: object) -> None:
        assert isinstance(state, LutTables)
        kernel = self._kernel(codes, y, state.values)
        if kernel is not None:
            kernel.decode(codes, state.values, state.rows, y)
            return
        self._lut.decode(codes, y.numel(), y, self.work, state)

    def _decode_add_chunk(self, codes: torch.Tensor, y: torch.Tensor, state: object) -> None:
        assert isinstance(state, LutTables)
        kernel = self._kernel(codes, y, state.values)
        if kernel is not None:
            kernel.decode(codes, state.values, state.rows, y, add=True)
            return
        super()._decode_add_chunk(codes, y, state)


def parse_table(bits: str) -> TableCodec:
    return TableCodec(int(bits))
