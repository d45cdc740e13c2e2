"""Typed entry points of the compressor kernels: codes, scales, error feedback; top-k (topk.c).

`CompressKernel.create` returns None where the kernels cannot run (no compiler, disabled);
`usable` says per call whether the tensors qualify (CPU, contiguous). The compressors
(`comm.compressors`) keep their torch path for everything else and as the reference;
their decoders look each code's value up with `TableKernel.decode`.
"""

from __future__ import annotations

import ctypes

import torch

from approxdist.kernels.build import load_kernels
from approxdist.kernels.slot import KernelSlot
from approxdist.kernels.table import need

_VOID, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_F32, _I32, _U32 = ctypes.c_float, ctypes.c_int32, ctypes.c_uint32
#: values a fixed-order sum's chunk holds (ordered.h's SUM_CHUNK)
SUM_CHUNK = 2048


class CompressKernel:
    """The fused encoders of the bit-packed compressors and top-k's selection, on torch's
    thread count."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._qsgd = lib.ad_qsgd_encode
        self._qsgd.argtypes = [_VOID, _I64, _F32, _I32, _U32, _INT, _VOID, _INT]
        self._terngrad = lib.ad_terngrad_encode
        self._terngrad.argtypes = [_VOID, _I64, _F32, _U32, _VOID, _INT]
        self._sign = lib.ad_sign_encode
        self._sign.argtypes = [_VOID, _I64, _VOID, _VOID, _VOID, _INT]
        self._most = lib.ad_max_magnitude
        self._most.argtypes = [_VOID, _I64, _INT]
        self._most.restype = _U32
        self._sum = lib.ad_feedback_sum
        self._sum.argtypes = [_VOID, _VOID, _VOID, _I64, _INT]
        self._sum.restype = _F32
        self._squares = lib.ad_square_sum
        self._squares.argtypes = [_VOID, _VOID, _I64, _INT]
        self._squares.restype = _F32
        self._topk = lib.ad_topk_select
        self._topk.argtypes = [_VOID, _I64, _I64, _VOID, _VOID, _VOID, _INT]
        self._topk.restype = _INT
        self._topk_feedback = lib.ad_topk_feedback
        self._topk_feedback.argtypes = [_VOID, _VOID, _I64, _I64, _VOID, _VOID, _INT]
        self._topk_feedback.restype = _INT
        for f in (self._qsgd, self._terngrad, self._sign):
            f.restype = None

    @staticmethod
    def create() -> CompressKernel | None:
        lib = load_kernels()
        return None if lib is None else CompressKernel(lib)

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
        value of codes 0 and 1) also write `residual = x - values[code]` (`residual` may be `x`
        itself: in place)."""
        need(x, torch.float32, x.numel(), "quantize")
        need(codes, torch.uint8, (x.numel() + 7) // 8, "quantize")
        pointers: tuple[int | None, int | None] = (None, None)
        if values is not None and residual is not None:
            need(values, torch.float32, 2, "quantize")
            need(residual, torch.float32, x.numel(), "quantize")
            pointers = (values.data_ptr(), residual.data_ptr())
        self._sign(x.data_ptr(), x.numel(), *pointers, codes.data_ptr(), torch.get_num_threads())

    def square_sum(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of fp32 `x`'s squares in `ordered.py`'s fixed order (a 0-d fp32 tensor):
        `ordered_sum(x * x)`'s bits, with any thread count."""
        need(x, torch.float32, x.numel(), "norm")
        sums = torch.empty(sum_chunks(x.numel()), dtype=torch.float32)
        total = self._squares(x.data_ptr(), sums.data_ptr(), x.numel(), torch.get_num_threads())
        return torch.tensor(total, dtype=torch.float32)

    def max_magnitude(self, x: torch.Tensor) -> torch.Tensor | None:
        """max |x| of fp32 `x` as a 0-d fp32 tensor (one of the values, so the same bits as
        any other exact reduction); None where it is zero or not finite (left to the caller)."""
        need(x, torch.float32, x.numel(), "quantize")
        most = self._most(x.data_ptr(), x.numel(), torch.get_num_threads())
        if most == 0 or most >= 0x7F800000:
            return None
        return torch.tensor([most], dtype=torch.int32).view(torch.float32)[0]

    def feedback_sum(self, grad: torch.Tensor | None, residual: torch.Tensor,
                     sums: torch.Tensor) -> torch.Tensor:
        """In one pass: `residual = grad + residual` (torch.add's fp32 sums; `grad` None: the
        residual only read) and the sum of `|residual|` in `comm.compressors.ordered`'s fixed
        order, returned as a 0-d fp32 tensor (`sums`: fp32 work space, `sum_chunks(n)`)."""
        n = residual.numel()
        for t in (residual, *(() if grad is None else (grad,))):
            need(t, torch.float32, n, "feedback")
        need(sums, torch.float32, sum_chunks(n), "feedback")
        total = self._sum(None if grad is None else grad.data_ptr(), residual.data_ptr(),
                          sums.data_ptr(), n, torch.get_num_threads())
        return torch.tensor(total, dtype=torch.float32)

    def topk(self, x: torch.Tensor, k: int, values: torch.Tensor, indices: torch.Tensor,
             residual: torch.Tensor | None = None) -> bool:
        """Write the k (1 <= k <= n < 2**31) values of largest magnitude of fp32 `x` and their
        int32 indices, in increasing index order (ties: the lower index), and where given
        `residual = x - (selected ? x : 0)`; False if the kernel could not allocate its
        histograms (nothing written)."""
        n = _topk_args(k, values, indices, x, *(() if residual is None else (residual,)))
        rest = None if residual is None else residual.data_ptr()
        return self._topk(x.data_ptr(), n, k, values.data_ptr(), indices.data_ptr(), rest,
                          torch.get_num_threads()) == 0

    def topk_feedback(self, grad: torch.Tensor, k: int, values: torch.Tensor,
                      indices: torch.Tensor, residual: torch.Tensor) -> bool:
        """`topk` of x = grad + residual (torch.add's fp32 sums) with the new residual written
        over the old in the same passes; False (nothing written) as `topk`."""
        n = _topk_args(k, values, indices, grad, residual)
        return self._topk_feedback(grad.data_ptr(), residual.data_ptr(), n, k, values.data_ptr(),
                                   indices.data_ptr(), torch.get_num_threads()) == 0


def fused(slot: KernelSlot[CompressKernel], use: bool,
          *tensors: torch.Tensor) -> CompressKernel | None:
    """The kernel `slot` holds (made on first use) if `use` and it can take these fp32
    tensors, else None (the caller's torch ops)."""
    if not use or not CompressKernel.usable(*tensors) \
            or any(t.dtype != torch.float32 for t in tensors):
        return None
    return slot.get(CompressKernel.create)


def sum_chunks(n: int) -> int:
    """The fp32 work space `feedback_sum` needs for n values: one float per chunk."""
    return -(-n // SUM_CHUNK)


def _topk_args(k: int, values: torch.Tensor, indices: torch.Tensor,
               *full: torch.Tensor) -> int:
    """Check a top-k call's tensors (`full`: fp32, n values each); returns n."""
    n = full[0].numel()
    if not 1 <= k <= n < 1 << 31:
        raise ValueError(f"top-k kernel needs 1 <= k <= n < 2**31; got k={k}, n={n}")
    for t in full:
        need(t, torch.float32, n, "top-k")
    need(values, torch.float32, k, "top-k")
    need(indices, torch.int32, k, "top-k")
    return n
