"""The codec contract: fp32 tensor <-> payload of real bytes on the wire.

A `Payload` is one 1-D uint8 tensor (the exact bytes handed to torch.distributed) plus
the logical shape of the tensor it encodes. The shape does not travel inside the bytes:
the link layer sends it in its own small header, or the receiver already knows it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Payload:
    """Encoded bytes of one tensor. `data` is 1-D uint8; `shape` is the decoded shape."""

    data: torch.Tensor
    shape: torch.Size

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= int(s)
        return n

    @property
    def wire_bytes(self) -> int:
        return int(self.data.numel())


class Codec(ABC):
    """Encodes fp32 tensors of any shape (contiguous or not, any length) into payloads."""

    #: the canonical spec string, e.g. "bits:s0e2+2m0"
    spec: str

    @property
    @abstractmethod
    def bits_per_value(self) -> float:
        """Bits each value occupies on the wire, headers and tables excluded."""

    @abstractmethod
    def payload_nbytes(self, numel: int) -> int:
        """Exact size in bytes of the payload for `numel` values (header and table included).

        A receiver that knows the element count can prepost a buffer of this size.
        """

    @abstractmethod
    def encode(self, x: torch.Tensor) -> Payload:
        """Encode `x` (fp32, any shape, any device) into a payload on the same device."""

    @abstractmethod
    def decode(self, payload: Payload) -> torch.Tensor:
        """Decode a payload into a new fp32 tensor of `payload.shape` on the payload's device.

        Raises `approxdist.errors.CodecError` for a truncated payload or one made by a
        different codec.
        """

    def roundtrip(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """What a receiver decodes from `encode(x)`, bit for bit, into `out` if given (fp32,
        same shape; may be `x` itself). Error feedback needs only this, not the bytes:
        codecs override it with a cheaper path (a bit mask, a cast) where one exists."""
        y = self.decode(self.encode(x))
        if out is None:
            return y
        out.copy_(y.view(out.shape))
        return out

    def decode_add(self, payload: Payload, dest: torch.Tensor) -> None:
        """`dest += decode(payload)` in fp32 (`dest` has the payload's element count); codecs
        fuse the two where they can (one pass, no decoded temporary), with the same sums."""
        dest.add_(self.decode(payload).view(dest.shape))

    @property
    def lossless(self) -> bool:
        return False

    @property
    def code_bits(self) -> int:
        """Width in bits of one value's code on the wire (what the channel corrupts)."""
        return int(self.bits_per_value)

    def codes_offset(self, numel: int) -> int:
        """Byte offset of the value codes in the payload (header and metadata come first).

        Codes form an LSB-first bit stream: code i occupies stream bits
        [i * code_bits, (i + 1) * code_bits), its least significant bit first; stream bit p is
        bit p % 8 of byte p // 8. The "top" bits of a code are its most significant ones.
        """
        return self.payload_nbytes(numel) - (numel * self.code_bits + 7) // 8

    def wire_bytes(self, payload: Payload) -> int:
        return payload.wire_bytes

    def __repr__(self) -> str:
        return f"<codec {self.spec}>"
