"""Exact fp32 through `Link.isend` / `Link.irecv` without codec copies (seed 001 transport).

The `fp32` codec's payload is its 16-byte header followed by the values' own bytes
(`codecs/framed.py`). Encoding copies the tensor into a fresh [header | values] buffer and
decoding copies the values out again: at 16 MiB about 9 ms each way on a 2-core machine,
more than gloo needs to move the bytes. For an *exact* transfer (codec `fp32`, no
channel) the link skips both copies and sends the same bytes:

* **Receiving**: the payload lands in a buffer allocated for this receive alone, and the
  result is a view of its values (after the header check): nothing is decoded or copied.
* **Sending, split layout** (at least `SPLIT_MIN_BYTES` of values): two messages, the
  codec header (16 bytes), then the contiguous tensor's own storage, read in place by
  torch.distributed, received straight into the storage of a new fp32 tensor. A
  non-contiguous or non-fp32 input is made contiguous fp32 once, as `encode` did.
* **Sending, framed layout** (smaller): one message, the header and the values copied
  once into a new buffer (`pack`: the bytes of `codec.encode` with less work per call).

Where the second message costs more than the copy it saves sets `SPLIT_MIN_BYTES`. It
does not on a 2-core machine: the split layout was 10-30 % faster than one framed
message at every size from 16 bytes to 256 KiB (interleaved ping-pongs of both layouts,
docs/collectives.md "Point to point"), the torch ops of the copy costing more than gloo's
second message.
So every non-empty tensor splits; the framed layout carries only empty ones.

Bytes on the wire and in `LinkStats` are the framed payload's exactly
(`codec.payload_nbytes(numel)`); the split layout adds one message. Both ends pick the
layout from the element count, which both know (a sized receive's shape, or the
self-describing header's), so no flag travels.
"""

from __future__ import annotations

import torch

from approxdist.comm.channel import Channel
from approxdist.comm.codecs import Codec
from approxdist.comm.codecs.framed import FramedCodec, as_fp32
from approxdist.comm.codecs.header import HEADER_NBYTES, check_header

#: exact transfers of at least this many bytes of values travel split (header, values)
SPLIT_MIN_BYTES = 4


def exact(codec: Codec, channel: Channel | None) -> bool:
    """Whether values through `codec` and `channel` arrive as sent, as fp32 bytes."""
    return channel is None and codec.spec == "fp32" and codec.lossless \
        and isinstance(codec, FramedCodec)


def splits(codec: Codec, channel: Channel | None, numel: int) -> bool:
    """Whether `numel` values through `codec` and `channel` travel as header + values."""
    return 4 * numel >= SPLIT_MIN_BYTES and exact(codec, channel)


def send_parts(codec: FramedCodec, x: torch.Tensor) -> list[torch.Tensor]:
    """The codec header and the values of `x` as bytes; the second aliases `x` when it is
    contiguous fp32 (it must then stay unchanged until the send's `wait()`)."""
    values = as_fp32(x, codec.spec).contiguous()
    flat = values if values.dim() == 1 else values.view(-1)
    return [codec.header(values.numel()).to(values.device), flat.view(torch.uint8)]


def pack(codec: FramedCodec, x: torch.Tensor) -> torch.Tensor:
    """The framed payload of `x`, the same bytes as `codec.encode(x).data`, in one copy."""
    x = as_fp32(x, codec.spec)
    n = x.numel()
    out = torch.empty(HEADER_NBYTES + 4 * n, dtype=torch.uint8, device=x.device)
    out[:HEADER_NBYTES].copy_(codec.header(n))
    out[HEADER_NBYTES:].view(torch.float32).view(x.shape).copy_(x)
    return out


def recv_parts(nbytes: int, shape: torch.Size, device: torch.device) -> list[torch.Tensor]:
    """New receive buffers for an exact payload of `nbytes` decoding to `shape`: the
    header and the values when the sender split it, else one buffer for both (also when
    `nbytes` is not an fp32 payload's size: `finish` then says what was sent)."""
    numel = shape.numel()
    if 4 * numel >= SPLIT_MIN_BYTES and nbytes == HEADER_NBYTES + 4 * numel:
        return [torch.empty(HEADER_NBYTES, dtype=torch.uint8, device=device),
                torch.empty(4 * numel, dtype=torch.uint8, device=device)]
    return [torch.empty(nbytes, dtype=torch.uint8, device=device)]


def finish(codec: FramedCodec, parts: list[torch.Tensor], shape: torch.Size) -> torch.Tensor:
    """The received fp32 tensor: a view of the buffers of `recv_parts`, which must not be
    reused. `CodecError` unless the header is `codec`'s for this many values."""
    numel = shape.numel()
    if len(parts) == 2:
        header, values = parts
    else:
        header, values = parts[0][:HEADER_NBYTES], parts[0][HEADER_NBYTES:]
    expected = codec.header(numel)
    if values.numel() != 4 * numel or not torch.equal(header, expected.to(header.device)):
        check_header(parts[0], codec.family, codec.spec, numel, codec.payload_nbytes(numel)
                     if len(parts) == 1 else HEADER_NBYTES)  # raises, naming what differs
    return values.view(torch.float32).view(shape)
