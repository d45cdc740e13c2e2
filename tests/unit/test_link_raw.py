"""Exact fp32 without copies (`comm/raw.py`) in one process: which transfers split, that
the parts are the framed payload's bytes, that a receive returns a view of its own buffer,
and the receiver's header check."""

from __future__ import annotations

import pytest
import torch

from approxdist.comm import raw
from approxdist.comm.channel import get_channel
from approxdist.comm.codecs import get_codec
from approxdist.comm.codecs.framed import FramedCodec
from approxdist.comm.codecs.header import HEADER_NBYTES, header_bytes
from approxdist.errors import CodecError

LIMIT = max(1, raw.SPLIT_MIN_BYTES // 4)  # values at the threshold
N = 4096


def _fp32() -> FramedCodec:
    codec = get_codec("fp32")
    assert isinstance(codec, FramedCodec)
    return codec


def test_only_exact_fp32_from_the_threshold_splits() -> None:
    fp32 = _fp32()
    assert not raw.splits(fp32, None, LIMIT - 1)
    assert raw.splits(fp32, None, LIMIT) and raw.splits(fp32, None, 1 << 22)
    assert not raw.splits(fp32, get_channel("ber:1e-3@5"), 1 << 22)
    for spec in ("bf16", "fp16", "fp8-e5m2", "bits:s1e8m23"):
        assert not raw.splits(get_codec(spec), None, 1 << 22), spec


@pytest.mark.parametrize("make", [
    lambda: torch.randn(N + 3),
    lambda: torch.randn(64, N // 32).t(),  # not contiguous
    lambda: torch.randn(3 * N)[N + 1::2],  # strided, with a storage offset
    lambda: torch.randn(N, dtype=torch.float64),
])
def test_parts_are_the_framed_payload(make) -> None:  # type: ignore[no-untyped-def]
    fp32, x = _fp32(), make()
    parts = raw.send_parts(fp32, x)
    assert [p.dtype for p in parts] == [torch.uint8, torch.uint8]
    assert torch.equal(torch.cat(parts), fp32.encode(x).data)
    shape = torch.Size(x.shape)
    bufs = raw.recv_parts(fp32.payload_nbytes(x.numel()), shape, x.device)
    assert [b.numel() for b in bufs] == [p.numel() for p in parts]
    for b, p in zip(bufs, parts):
        b.copy_(p)
    y = raw.finish(fp32, bufs, shape)
    assert y.shape == shape and y.dtype == torch.float32 and torch.equal(y, x.float())
    assert y.data_ptr() == bufs[1].data_ptr()  # the received bytes themselves, not a copy


@pytest.mark.parametrize("shape", [(0,), (2, 0), (), (3, 5)])
def test_framed_receive_is_a_view_of_its_buffer(shape: tuple[int, ...]) -> None:
    fp32 = _fp32()
    x = torch.randn(shape)
    data = fp32.encode(x).data
    if x.numel() < LIMIT:  # what the link receives into; larger tensors arrive split
        (buf,) = raw.recv_parts(data.numel(), torch.Size(shape), x.device)
        buf.copy_(data)
    else:
        buf = data.clone()
    y = raw.finish(fp32, [buf], torch.Size(shape))
    assert y.shape == x.shape and torch.equal(y, x)
    assert y.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()


@pytest.mark.parametrize("make", [
    lambda: torch.randn(0), lambda: torch.randn(()), lambda: torch.randn(5, 7).t(),
    lambda: torch.randn(40, dtype=torch.float64)[3::3], lambda: torch.randn(9).half(),
])
def test_pack_is_encode(make) -> None:  # type: ignore[no-untyped-def]
    fp32, x = _fp32(), make()
    assert torch.equal(raw.pack(fp32, x), fp32.encode(x).data)


def test_contiguous_fp32_is_sent_in_place() -> None:
    x = torch.randn(N)
    assert raw.send_parts(_fp32(), x)[1].data_ptr() == x.data_ptr()


def test_a_foreign_or_wrong_size_header_is_refused() -> None:
    fp32, shape = _fp32(), torch.Size([N])
    bufs = raw.recv_parts(fp32.payload_nbytes(N), shape, torch.device("cpu"))
    bufs[0].copy_(header_bytes("bf16", "bf16", N))
    with pytest.raises(CodecError, match="different codec"):
        raw.finish(fp32, bufs, shape)
    bufs[0].copy_(header_bytes("fp32", "fp32", N + 1))
    with pytest.raises(CodecError, match=f"holds {N + 1} values"):
        raw.finish(fp32, bufs, shape)
    assert bufs[0].numel() == HEADER_NBYTES
    # a framed payload of another codec: one buffer of its size, refused on arrival
    small, other = torch.Size([7]), get_codec("bf16").encode(torch.ones(7)).data
    (buf,) = raw.recv_parts(other.numel(), small, torch.device("cpu"))
    buf.copy_(other)
    with pytest.raises(CodecError, match="different codec"):
        raw.finish(fp32, [buf], small)
