"""A codec that adds up the seconds its encode and decode take (the pipeline transport's
`codec_seconds`, charged to communication)."""

from __future__ import annotations

import time

import torch

from approxdist.comm.codecs import Codec, Payload
from approxdist.comm.codecs.framed import FramedCodec


class TimedCodec(Codec):
    """Delegates to `inner` and adds up the seconds spent in encode and decode."""

    def __init__(self, inner: Codec) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.seconds = 0.0

    @property
    def bits_per_value(self) -> float:
        return self.inner.bits_per_value

    def payload_nbytes(self, numel: int) -> int:
        return self.inner.payload_nbytes(numel)

    def encode(self, x: torch.Tensor, out: torch.Tensor | None = None) -> Payload:
        """Encode, into `out` (exactly `payload_nbytes` bytes) when the codec can."""
        t0 = time.perf_counter()
        framed = out is not None and isinstance(self.inner, FramedCodec)
        payload = self.inner.encode(x, out=out) if framed else self.inner.encode(x)  # type: ignore[call-arg]
        self.seconds += time.perf_counter() - t0
        return payload

    def decode(self, payload: Payload, out: torch.Tensor | None = None) -> torch.Tensor:
        """Decode, into `out` (contiguous fp32 of the payload's shape) when the codec can."""
        t0 = time.perf_counter()
        framed = out is not None and isinstance(self.inner, FramedCodec)
        x = self.inner.decode(payload, out=out) if framed else self.inner.decode(payload)  # type: ignore[call-arg]
        self.seconds += time.perf_counter() - t0
        return x

    @property
    def lossless(self) -> bool:
        return self.inner.lossless

    @property
    def code_bits(self) -> int:
        return self.inner.code_bits

    def codes_offset(self, numel: int) -> int:
        return self.inner.codes_offset(numel)
