"""Typed entry points of the Table-N kernels (table.c): sorted sample, encode, decode, decode-add.

`TableKernel.create` returns None where the kernels cannot run (no compiler, disabled);
`usable` says per call whether the tensors qualify (CPU, contiguous). The codec
(`comm.codecs.table`) keeps its torch path for everything else and as the reference.
"""

from __future__ import annotations

import ctypes

import torch

from approxdist.kernels.build import load_kernels

_VOID, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


class TableKernel:
    """The fused Table-N kernels for codes of `bits` bits."""

    def __init__(self, lib: ctypes.CDLL, bits: int) -> None:
        self.bits = bits
        self._encode = lib.ad_table_encode
        self._encode.argtypes = [_VOID, _I64, _VOID, _I64, _INT, _VOID, _INT]
        self._decode = lib.ad_table_decode
        self._decode.argtypes = [_VOID, _I64, _VOID, _VOID, _INT, _VOID, _INT, _INT, _INT]
        self._sample = lib.ad_table_sample
        self._sample.argtypes = [_VOID, _I64, _I64, _VOID, _VOID]
        self._sample.restype = _I64
        for f in (self._encode, self._decode):
            f.restype = None

    @staticmethod
    def create(bits: int) -> TableKernel | None:
        if not 1 <= bits <= 32:
            return None
        lib = load_kernels()
        return None if lib is None else TableKernel(lib, bits)

    @staticmethod
    def usable(*tensors: torch.Tensor) -> bool:
        return all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)

    def sorted_sample(self, x: torch.Tensor, step: int) -> torch.Tensor:
        """The finite |x[::step]| in increasing order (fp32), as torch's sort would give."""
        need(x, torch.float32, x.numel())
        room = -(-x.numel() // step) if x.numel() else 0
        buf = torch.empty(2 * room, dtype=torch.int32)
        count = self._sample(x.data_ptr(), x.numel(), step, buf.data_ptr(),
                             buf.data_ptr() + 4 * room)
        return buf[:count].view(torch.float32)

    def encode(self, x: torch.Tensor, mids: torch.Tensor, codes: torch.Tensor) -> None:
        """Pack the codes of fp32 `x` against the int32 threshold patterns `mids`."""
        need(x, torch.float32, x.numel())
        need(mids, torch.int32, mids.numel())
        need(codes, torch.uint8, self._nbytes(x.numel()))
        self._encode(x.data_ptr(), x.numel(), mids.data_ptr(), mids.numel(), self.bits,
                     codes.data_ptr(), torch.get_num_threads())

    def decode(self, codes: torch.Tensor, values: torch.Tensor, rows: torch.Tensor | None,
               y: torch.Tensor, add: bool = False, stream: bool | None = None) -> None:
        """`y = ` (or `+=` with `add`) the values of the packed `codes`: `values` holds the
        2T code values, `rows` (256 x 8/bits, for widths dividing 8) the per-byte rows.
        `stream`: write `y` with non-temporal stores (store.h; None: for large outputs)."""
        need(y, torch.float32, y.numel())
        need(codes, torch.uint8, self._nbytes(y.numel()))
        need(values, torch.float32, 1 << self.bits)
        rows_ptr = None
        if rows is not None and 8 % self.bits == 0:
            need(rows, torch.float32, 256 * (8 // self.bits))
            rows_ptr = rows.data_ptr()
        self._decode(codes.data_ptr(), y.numel(), values.data_ptr(), rows_ptr, self.bits,
                     y.data_ptr(), int(add), torch.get_num_threads(), stream_flag(stream))

    def _nbytes(self, n: int) -> int:
        return (n * self.bits + 7) // 8


def need(t: torch.Tensor, dtype: torch.dtype, numel: int, kernel: str = "table") -> None:
    """Internal invariants of a kernel call: a wrong pointer would corrupt memory, not raise."""
    if t.dtype != dtype or t.numel() < numel or t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"{kernel} kernel needs a contiguous CPU {dtype} tensor of >= {numel} "
                         f"values; got {t.dtype} {tuple(t.shape)} on {t.device}")


def stream_flag(stream: bool | None) -> int:
    """A decode kernel's `stream` argument: -1 lets it decide by size, 1 or 0 forces it."""
    return -1 if stream is None else int(stream)
