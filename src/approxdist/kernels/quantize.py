"""Typed entry points of the compressor encoders (quantize.c): QSGD, TernGrad and sign codes.

`QuantKernel.create` returns None where the kernels cannot run (no compiler, disabled);
`usable` says per call whether the tensors qualify (CPU, contiguous). The compressors
(`comm.compressors`) keep their torch path for everything else and as the reference;
their decoders look each code's value up with `TableKernel.decode`.
"""

from __future__ import annotations

import ctypes

import torch

from approxdist.kernels.build import load_kernels
from approxdist.kernels.table import need

_VOID, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_F32, _I32, _U32 = ctypes.c_float, ctypes.c_int32, ctypes.c_uint32


class QuantKernel:
    """The fused encoders of the bit-packed compressors, on torch's thread count."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._qsgd = lib.ad_qsgd_encode
        self._qsgd.argtypes = [_VOID, _I64, _F32, _I32, _U32, _INT, _VOID, _INT]
        self._terngrad = lib.ad_terngrad_encode
        self._terngrad.argtypes = [_VOID, _I64, _F32, _U32, _VOID, _INT]
        self._sign = lib.ad_sign_encode
        self._sign.argtypes = [_VOID, _I64, _VOID, _VOID, _VOID, _INT]
        for f in (self._qsgd, self._terngrad, self._sign):
            f.restype = None

    @staticmethod
    def create() -> QuantKernel | None:
        lib = load_kernels()
        return None if lib is None else QuantKernel(lib)

    @staticmethod
    def usable(*tensors: torch.Tensor) -> bool:
        return all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)

    def qsgd(self, x: torch.Tensor, scale: float, levels: int, key: int, width: int,
             codes: torch.Tensor) -> None:
        """Pack QSGD's `width`-bit codes of fp32 `x` (scale = levels / norm, finite, > 0)."""
        need(x, torch.float32, x.numel(), "quantize")
        need(codes, torch.uint8, (x.numel() * width + 7) // 8, "quantize")
        self._qsgd(x.data_ptr(), x.numel(), scale, levels, key, width, codes.data_ptr(),
                   torch.get_num_threads())

    def terngrad(self, x: torch.Tensor, scale: float, key: int, codes: torch.Tensor) -> None:
        """Pack TernGrad's 2-bit codes of fp32 `x` (scale = max |x|, finite, > 0)."""
        need(x, torch.float32, x.numel(), "quantize")
        need(codes, torch.uint8, (x.numel() * 2 + 7) // 8, "quantize")
        self._terngrad(x.data_ptr(), x.numel(), scale, key, codes.data_ptr(),
                       torch.get_num_threads())

    def sign(self, x: torch.Tensor, codes: torch.Tensor, values: torch.Tensor | None = None,
             residual: torch.Tensor | None = None) -> None:
        """Pack one bit per value of fp32 `x` (1: x < 0); with `values` (fp32, the decoded
        value of codes 0 and 1) also write `residual = x - values[code]`."""
        need(x, torch.float32, x.numel(), "quantize")
        need(codes, torch.uint8, (x.numel() + 7) // 8, "quantize")
        pointers = (None, None)
        if values is not None and residual is not None:
            need(values, torch.float32, 2, "quantize")
            need(residual, torch.float32, x.numel(), "quantize")
            pointers = (values.data_ptr(), residual.data_ptr())
        self._sign(x.data_ptr(), x.numel(), *pointers, codes.data_ptr(), torch.get_num_threads())

