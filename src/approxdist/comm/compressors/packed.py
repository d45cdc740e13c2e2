"""Payloads of one fp32 scale followed by bit-packed codes (QSGD, TernGrad, the sign methods)."""

from __future__ import annotations

import torch

from approxdist.comm.buffers import BufferPool
from approxdist.comm.codecs.base import Payload
from approxdist.comm.codecs.bitpack import code_dtype, pack_codes, packed_nbytes, unpack_codes
from approxdist.comm.codecs.framed import typed


class ScaledCodes:
    """`width`-bit codes of `numel` values, after a 4-byte fp32 scale when `scaled`."""

    def __init__(self, width: int, numel: int, scaled: bool = True) -> None:
        self.width = width
        self.numel = numel
        self.head = 4 if scaled else 0
        self.work = BufferPool()

    def nbytes(self) -> int:
        return self.head + packed_nbytes(self.numel, self.width)

    def pack(self, codes: torch.Tensor, scale: torch.Tensor | None, shape: torch.Size) -> Payload:
        """`codes` (any integer dtype, values < 2**width) and the scale -> one payload."""
        data = torch.empty(self.nbytes(), dtype=torch.uint8, device=codes.device)
        if scale is not None:
            data[: self.head].copy_(scale.reshape(1).to(torch.float32).view(torch.uint8))
        pack_codes(codes.to(code_dtype(self.width)), self.width, data[self.head:], self.work)
        return Payload(data, shape)

    def unpack(self, payload: Payload) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(int32 codes, a new tensor; the fp32 scale, or None) of a payload."""
        data = payload.data
        scale = typed(data[: self.head], torch.float32)[0].clone() if self.head else None
        codes = unpack_codes(data[self.head:], self.width, self.numel, self.work).clone()
        return codes, scale
