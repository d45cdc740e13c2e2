"""Typed entry points of the bit-field kernels (bitfield.c): encode, decode, decode-and-add.

`BitKernel.create` returns None where the kernels cannot run (no compiler, disabled, or
more than 4 runs of kept bits); `usable` says per call whether the tensors qualify
(CPU, contiguous, the right dtypes). Callers keep their torch path for everything else.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence

import torch

from approxdist.kernels.build import load_kernels
from approxdist.kernels.table import stream_flag

_MAX_RUNS = 4
_VOID, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


class BitKernel:
    """The fused kernels for one layout: runs of (fp32 bit lo, length, code position)."""

    def __init__(self, lib: ctypes.CDLL, runs: Sequence[tuple[int, int, int]], width: int) -> None:
        shifts = [lo - pos for lo, _, pos in runs] + [0] * (_MAX_RUNS - len(runs))
        masks = [((1 << length) - 1) << pos for _, length, pos in runs] + [0] * (_MAX_RUNS - len(runs))
        self._layout = struct.pack("=8I", *shifts, *masks)
        self.width = width
        self._encode = _fn(lib.ad_bits_encode)
        self._decode = _fn(lib.ad_bits_decode, stream=True)
        self._decode_add = _fn(lib.ad_bits_decode_add)

    @staticmethod
    def create(runs: Sequence[tuple[int, int, int]], width: int) -> BitKernel | None:
        if not runs or len(runs) > _MAX_RUNS or not 1 <= width <= 32:
            return None
        lib = load_kernels()
        return None if lib is None else BitKernel(lib, runs, width)

    @staticmethod
    def usable(*tensors: torch.Tensor) -> bool:
        return all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)

    def encode(self, x: torch.Tensor, codes: torch.Tensor) -> None:
        """Pack the codes of fp32 `x` into uint8 `codes` (ceil(n*width/8) bytes)."""
        _check(x, torch.float32, codes, self._nbytes(x.numel()))
        self._encode(x.data_ptr(), x.numel(), self._layout, self.width, codes.data_ptr(),
                     torch.get_num_threads())

    def decode(self, codes: torch.Tensor, y: torch.Tensor, stream: bool | None = None) -> None:
        """Fill fp32 `y` with the values of packed `codes`; `stream`: with non-temporal
        stores (store.h; None: for large outputs)."""
        _check(y, torch.float32, codes, self._nbytes(y.numel()))
        self._decode(codes.data_ptr(), y.numel(), self._layout, self.width, y.data_ptr(),
                     torch.get_num_threads(), stream_flag(stream))

    def decode_add(self, codes: torch.Tensor, y: torch.Tensor) -> None:
        """`y += values of packed codes`, one pass, the same fp32 sums as torch's add."""
        _check(y, torch.float32, codes, self._nbytes(y.numel()))
        self._decode_add(codes.data_ptr(), y.numel(), self._layout, self.width, y.data_ptr(),
                         torch.get_num_threads())

    def _nbytes(self, n: int) -> int:
        return (n * self.width + 7) // 8


def _fn(f: ctypes._CFuncPtr, stream: bool = False) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    f.argtypes = [_VOID, _I64, ctypes.c_char_p, _INT, _VOID, _INT] + [_INT] * stream
    f.restype = None
    return f


def _check(values: torch.Tensor, dtype: torch.dtype, codes: torch.Tensor, nbytes: int) -> None:
    """Internal invariants: a wrong pointer here would corrupt memory, not raise."""
    if values.dtype != dtype or codes.dtype != torch.uint8 or codes.numel() < nbytes \
            or not BitKernel.usable(values, codes):
        raise ValueError(f"bit kernel needs contiguous CPU {dtype} values and >= {nbytes} uint8 "
                         f"code bytes; got {values.dtype} {tuple(values.shape)} and "
                         f"{codes.dtype} {tuple(codes.shape)}")
