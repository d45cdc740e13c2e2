"""Payloads of one fp32 scale followed by bit-packed codes (QSGD, TernGrad, the sign methods).

On CPU the codes are made by fused C kernels (`kernels/quantize.c`) and codes of at most 8
bits decoded by looking each code's value up (`TableKernel.decode`, also decode-and-add);
the torch ops are the fallback elsewhere and the reference, bit for bit (`use_kernels =
False` forces them).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING

import torch

from approxdist.comm.buffers import BufferPool
from approxdist.comm.codecs.base import Payload
from approxdist.comm.codecs.bitpack import code_dtype, pack_codes, packed_nbytes, unpack_codes
from approxdist.comm.codecs.framed import typed
from approxdist.comm.compressors.base import Gathered
from approxdist.kernels.compress import CompressKernel, fused
from approxdist.kernels.slot import KernelSlot
from approxdist.kernels.table import TableKernel

if TYPE_CHECKING:
    from approxdist.comm.compressors.packed_bucket import Members


class ScaledCodes:
    """`width`-bit codes of `numel` values, after a 4-byte fp32 scale when `scaled`."""

    def __init__(self, width: int, numel: int, scaled: bool = True) -> None:
        self.width = width
        self.numel = numel
        self.head = 4 if scaled else 0
        self.work = BufferPool()
        self.use_kernels = True  # False: always the torch ops (the reference)
        self._encoder: KernelSlot[CompressKernel] = KernelSlot()
        self._decoder: KernelSlot[TableKernel] = KernelSlot()

    def nbytes(self) -> int:
        return self.head + packed_nbytes(self.numel, self.width)

    def encoder(self, *tensors: torch.Tensor) -> CompressKernel | None:
        """The fused encoder if it can take these tensors (fp32 values on CPU), else None."""
        return fused(self._encoder, self.use_kernels, *tensors)

    def blank(self, scale: torch.Tensor | None, shape: torch.Size,
              device: torch.device) -> tuple[Payload, torch.Tensor]:
        """A payload with its scale written, and the region its codes go to (a kernel's output)."""
        data = torch.empty(self.nbytes(), dtype=torch.uint8, device=device)
        if scale is not None:
            data[: self.head].copy_(scale.reshape(1).to(torch.float32).view(torch.uint8))
        return Payload(data, shape), data[self.head:]

    def pack(self, codes: torch.Tensor, scale: torch.Tensor | None, shape: torch.Size) -> Payload:
        """`codes` (any integer dtype, values < 2**width) and the scale -> one payload."""
        payload, region = self.blank(scale, shape, codes.device)
        pack_codes(codes.to(code_dtype(self.width)), self.width, region, self.work)
        return payload

    def scale(self, payload: Payload) -> torch.Tensor | None:
        """The fp32 scale of a payload (a new 0-d tensor), or None."""
        return typed(payload.data[: self.head], torch.float32)[0].clone() if self.head else None

    def unpack(self, payload: Payload) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(int32 codes, a new tensor; the fp32 scale, or None) of a payload."""
        codes = unpack_codes(payload.data[self.head:], self.width, self.numel, self.work).clone()
        return codes, self.scale(payload)

    def decoder(self, payload: Payload, *tensors: torch.Tensor) -> TableKernel | None:
        """The fused decoder if it can take the payload and these fp32 tensors, else None
        (also for codes of more than 8 bits: a table of their values would cost more to
        build than the torch decoder's few passes)."""
        if not self.use_kernels or self.width > 8 \
                or not TableKernel.usable(payload.data, *tensors):
            return None
        return self._decoder.get(lambda: TableKernel.create(self.width))

    def lookup(self, kernel: TableKernel, payload: Payload, values: torch.Tensor,
               out: torch.Tensor | None = None, add: bool = False) -> torch.Tensor:
        """`values[code]` of each code (fp32 `values`, 2**width of them), flat: a new tensor,
        or written (`add`: added) into the contiguous fp32 `out`."""
        region = payload.data[self.head:]
        y = torch.empty(self.numel, device=region.device) if out is None else out.view(-1)
        kernel.decode(region, values, None, y, add=add)
        return y


class Packed(Gathered):
    """A gathered compressor whose payload is `ScaledCodes`: decoded through each code's value."""

    codes: ScaledCodes

    def wire_bytes(self) -> int:
        return self.codes.nbytes()

    def values(self, scale: torch.Tensor | None) -> torch.Tensor:
        """The fp32 value of every code 0 .. 2**width - 1 of one payload of scale `scale`: the
        torch ops of `from_codes`, so a lookup gives its bits."""
        return self.from_codes(torch.arange(1 << self.codes.width, dtype=torch.int32), scale)

    def tables(self, scales: torch.Tensor | None, count: int) -> torch.Tensor:
        """`values` of `count` payloads at once (`scales`: their fp32 scales, one a row; a
        row of code values each): the same elementwise ops, so the same bits."""
        codes = torch.arange(1 << self.codes.width, dtype=torch.int32).repeat(count, 1)
        return self.from_codes(codes, scales)

    @abstractmethod
    def encode_members(self, members: Members) -> None:
        """Every member's `outgoing` of a bucket (`packed_bucket.py`; this compressor is its
        first member): its payload written into the bucket's, its state updated."""

    @abstractmethod
    def from_codes(self, codes: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        """The reference decoder: torch ops on the unpacked int32 codes."""

    def decode(self, payload: Payload) -> torch.Tensor:
        kernel = self.codes.decoder(payload)
        if kernel is None:
            return self.from_codes(*self.codes.unpack(payload))
        return self.codes.lookup(kernel, payload, self.values(self.codes.scale(payload)))

    def decode_into(self, payload: Payload, out: torch.Tensor | None) -> torch.Tensor:
        kernel = None if out is None else self.codes.decoder(payload, out)
        if kernel is None:
            return super().decode_into(payload, out)
        return self.codes.lookup(kernel, payload, self.values(self.codes.scale(payload)), out)

    def decode_add(self, payload: Payload, dest: torch.Tensor) -> None:
        kernel = self.codes.decoder(payload, dest) if dest.dtype == torch.float32 else None
        if kernel is None:
            super().decode_add(payload, dest)
            return
        self.codes.lookup(kernel, payload, self.values(self.codes.scale(payload)), dest, add=True)
