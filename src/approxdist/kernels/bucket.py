"""Typed entry points of the bucket kernels (bucket.c): a compressor kernel over many tensors in one call.

Members are described by int64 tensors of addresses (`pointers`) and of lengths; the
caller (`comm.compressors.packed_bucket`) checks once that each address has room for its
member (a wrong one would corrupt memory, not raise). An address of 0 skips a member in
the encoders.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from approxdist.kernels.build import load_kernels
from approxdist.kernels.compress import sum_chunks

_VOID, _I64, _INT, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int32


class BucketKernel:
    """The bit-packed compressors' kernels over `count` members a call, on torch's thread count."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._feedback = lib.ad_bucket_feedback_sum
        self._feedback.argtypes = [_I64, _VOID, _VOID, _VOID, _VOID, _VOID, _INT]
        self._squares = lib.ad_bucket_square_sum
        self._squares.argtypes = [_I64, _VOID, _VOID, _VOID, _VOID, _INT]
        self._most = lib.ad_bucket_max_magnitude
        self._most.argtypes = [_I64, _VOID, _VOID, _VOID, _INT]
        self._sign = lib.ad_bucket_sign_encode
        self._sign.argtypes = [_I64, _VOID, _VOID, _VOID, _VOID, _VOID, _INT]
        self._qsgd = lib.ad_bucket_qsgd_encode
        self._qsgd.argtypes = [_I64, _VOID, _VOID, _VOID, _I32, _VOID, _INT, _VOID, _INT]
        self._terngrad = lib.ad_bucket_terngrad_encode
        self._terngrad.argtypes = [_I64, _VOID, _VOID, _VOID, _VOID, _VOID, _INT]
        self._decode = lib.ad_bucket_decode
        self._decode.argtypes = [_I64, _INT, _VOID, _VOID, _VOID, _INT, _VOID, _INT]
        for f in (self._feedback, self._squares, self._most, self._sign, self._qsgd,
                  self._terngrad, self._decode):
            f.restype = None

    @staticmethod
    def create() -> BucketKernel | None:
        lib = load_kernels()
        return None if lib is None else BucketKernel(lib)

    def feedback_sums(self, grads: torch.Tensor | None, residuals: torch.Tensor,
                      lengths: torch.Tensor) -> torch.Tensor:
        """Each member's `CompressKernel.feedback_sum` (residual = grad + residual, then the
        fixed-order sum of its magnitudes; `grads` None: the residuals only read): fp32 sums."""
        count, work = _work(lengths)
        totals = torch.empty(count, dtype=torch.float32)
        self._feedback(count, None if grads is None else grads.data_ptr(), residuals.data_ptr(),
                       lengths.data_ptr(), work.data_ptr(), totals.data_ptr(), _threads())
        return totals

    def square_sums(self, xs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Each member's `CompressKernel.square_sum`: fp32 sums of squares."""
        count, work = _work(lengths)
        totals = torch.empty(count, dtype=torch.float32)
        self._squares(count, xs.data_ptr(), lengths.data_ptr(), work.data_ptr(),
                      totals.data_ptr(), _threads())
        return totals

    def max_magnitudes(self, xs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Each member's largest |x| as its int32 bit pattern (a NaN's above +inf's)."""
        most = torch.empty(lengths.numel(), dtype=torch.int32)
        self._most(lengths.numel(), xs.data_ptr(), lengths.data_ptr(), most.data_ptr(),
                   _threads())
        return most

    def sign(self, xs: torch.Tensor, lengths: torch.Tensor, codes: torch.Tensor,
             values: torch.Tensor | None = None, residuals: torch.Tensor | None = None) -> None:
        """Each member's `CompressKernel.sign` (`values`: fp32, two a member)."""
        _check(values, torch.float32, 2 * lengths.numel())
        self._sign(lengths.numel(), xs.data_ptr(), lengths.data_ptr(),
                   None if values is None else values.data_ptr(),
                   None if residuals is None else residuals.data_ptr(), codes.data_ptr(),
                   _threads())

    def qsgd(self, xs: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor, levels: int,
             keys: Sequence[int], width: int, codes: torch.Tensor) -> None:
        """Each member's `CompressKernel.qsgd` (fp32 `scales`, 32-bit step `keys`)."""
        _check(scales, torch.float32, lengths.numel())
        self._qsgd(lengths.numel(), xs.data_ptr(), lengths.data_ptr(), scales.data_ptr(), levels,
                   _words(keys, lengths.numel()), width, codes.data_ptr(), _threads())

    def terngrad(self, xs: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor,
                 keys: Sequence[int], codes: torch.Tensor) -> None:
        """Each member's `CompressKernel.terngrad`."""
        _check(scales, torch.float32, lengths.numel())
        self._terngrad(lengths.numel(), xs.data_ptr(), lengths.data_ptr(), scales.data_ptr(),
                       _words(keys, lengths.numel()), codes.data_ptr(), _threads())

    def decode(self, codes: torch.Tensor, lengths: torch.Tensor, world: int,
               values: torch.Tensor, bits: int, ys: torch.Tensor) -> None:
        """ys[i] = the worker-order sum of each worker's decoded codes of member i (`codes`:
        member-major, `world` a member; `values`: 2**bits fp32 each, in the same order)."""
        count = lengths.numel()
        _check(codes, torch.int64, count * world)
        _check(values, torch.float32, count * world << bits)
        self._decode(count, world, codes.data_ptr(), lengths.data_ptr(), values.data_ptr(), bits,
                     ys.data_ptr(), _threads())


def pointers(base: int, offsets: torch.Tensor) -> torch.Tensor:
    """The int64 addresses `base + offsets` (byte offsets) of a bucket's members."""
    return offsets + base


def _work(lengths: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(members, the fp32 work space of a fixed-order sum over the longest)."""
    count = lengths.numel()
    longest = int(lengths.max()) if count else 0
    return count, torch.empty(max(sum_chunks(longest), 1), dtype=torch.float32)


def _words(keys: Sequence[int], count: int) -> ctypes.Array[ctypes.c_uint32]:
    """One uint32 a member."""
    if len(keys) != count:
        raise ValueError(f"bucket kernel needs {count} keys, got {len(keys)}")
    return (ctypes.c_uint32 * count)(*keys)


def _check(t: torch.Tensor | None, dtype: torch.dtype, numel: int) -> None:
    if t is not None and (t.dtype != dtype or t.numel() != numel or not t.is_contiguous()
                          or t.device.type != "cpu"):
        raise ValueError(f"bucket kernel needs a contiguous CPU {dtype} tensor of {numel} "
                         f"values; got {t.dtype} {tuple(t.shape)} on {t.device}")


def _threads() -> int:
    return torch.get_num_threads()
