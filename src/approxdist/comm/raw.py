"""Exact fp32 through `Link.isend` / `Link.irecv` without codec copies: the split payload.

The `fp32` codec's payload is its 16-byte header followed by the values' own bytes
(`codecs/framed.py`). Framing it means copying the tensor into a fresh buffer to send and
out of the received buffer to decode: at 16 MiB about 9 ms each way on a 2-core machine,
more than gloo needs to move the bytes. For an exact `fp32` transfer (no channel) of at
least `SPLIT_MIN_BYTES` of values the link sends the same bytes as two messages instead:

1. the codec header (16 bytes, made by `codecs.header`, checked by the receiver);
2. the values: the contiguous tensor's own storage, read in place by torch.distributed.

The receiver posts the values straight into the storage of a new fp32 tensor and returns
that tensor: nothing is encoded, decoded or copied (a non-contiguous or non-fp32 input is
made contiguous fp32 once, as `encode` did). Bytes on the wire and in `LinkStats` are the
framed payload's exactly (`codec.payload_nbytes(numel)`); only the message count grows by
one. Both ends choose the layout from the element count, which both know (a sized
receive's shape, or the self-describing header's), so no flag travels. Below
`SPLIT_MIN_BYTES` one framed message stays cheaper than a second message (measured with
`approxdist bench p2p`, docs/collectives.md "Point to point").
"""

from __future__ import annotations

import torch

from approxdist.comm.channel import Channel
from approxdist.comm.codecs import Codec
from approxdist.comm.codecs.framed import FramedCodec, as_fp32
from approxdist.comm.codecs.header import HEADER_NBYTES, check_header, header_bytes

#: values of at least this many bytes travel split (header, then the values in place)
SPLIT_MIN_BYTES = 64 << 10


def splits(codec: Codec, channel: Channel | None, numel: int) -> bool:
    """Whether `numel` values through `codec` and `channel` travel as header + values."""
    return (channel is None and 4 * numel >= SPLIT_MIN_BYTES and codec.spec == "fp32"
            and codec.lossless and isinstance(codec, FramedCodec))


def send_parts(codec: FramedCodec, x: torch.Tensor) -> list[torch.Tensor]:
    """The codec header and the values of `x` as bytes; the second aliases `x` when it is
    contiguous fp32 (it must then stay unchanged until the send's `wait()`)."""
    values = as_fp32(x, codec.spec).contiguous()
    header = header_bytes(codec.family, codec.spec, values.numel())
    return [header.to(values.device), values.view(-1).view(torch.uint8)]


def recv_parts(shape: torch.Size, device: torch.device) -> list[torch.Tensor]:
    """Receive buffers for a split payload: the header, then a new fp32 tensor's bytes."""
    values = torch.empty(shape, dtype=torch.float32, device=device)
    header = torch.empty(HEADER_NBYTES, dtype=torch.uint8, device=device)
    return [header, values.view(-1).view(torch.uint8)]


def finish(codec: FramedCodec, parts: list[torch.Tensor], shape: torch.Size) -> torch.Tensor:
    """The received tensor, after checking the header (`CodecError` if it is not `codec`'s
    header for this many values)."""
    header, values = parts
    numel = values.numel() // 4
    check_header(header, codec.family, codec.spec, numel, HEADER_NBYTES)
    return values.view(torch.float32).view(shape)
