"""Cast codecs `fp32`, `fp16`, `bf16`: torch's own round-to-nearest-even casts (seed 004 "float")."""

from __future__ import annotations

import torch

from approxdist.comm.codecs.framed import FramedCodec, typed


class CastCodec(FramedCodec):
    """Sends each value as a 32/16-bit float; codes are the value's bits in little-endian order."""

    chunk = 0  # one cast is one pass: nothing to keep in cache

    def __init__(self, spec: str, dtype: torch.dtype) -> None:
        super().__init__(spec)
        self.family = spec
        self.dtype = dtype

    @property
    def code_bits(self) -> int:
        return self.dtype.itemsize * 8

    @property
    def lossless(self) -> bool:
        return self.dtype == torch.float32

    def roundtrip(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The cast there and back, without headers or byte buffers."""
        x = x.detach().float()
        out = torch.empty_like(x) if out is None else out
        return out.copy_(x.to(self.dtype))

    def _encode_chunk(self, x: torch.Tensor, codes: torch.Tensor, state: object) -> None:
        typed(codes, self.dtype).copy_(x)

    def _decode_chunk(self, codes: torch.Tensor, y: torch.Tensor, state: object) -> None:
        y.copy_(typed(codes, self.dtype))

    def _decode_add_chunk(self, codes: torch.Tensor, y: torch.Tensor, state: object) -> None:
        y.add_(typed(codes, self.dtype))  # torch adds in fp32: the same sum as decode-then-add


def fp32() -> CastCodec:
    return CastCodec("fp32", torch.float32)


def fp16() -> CastCodec:
    return CastCodec("fp16", torch.float16)


def bf16() -> CastCodec:
    return CastCodec("bf16", torch.bfloat16)
