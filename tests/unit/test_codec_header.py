"""Payload headers: truncated, padded, foreign or wrong-codec payloads fail with CodecError."""

from __future__ import annotations

import pytest
import torch

from approxdist.comm.codecs import DEFAULT_SPECS, Payload, get_codec
from approxdist.comm.codecs.header import HEADER_NBYTES, MAGIC
from approxdist.errors import CodecError

X = torch.randn(37, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("spec", DEFAULT_SPECS)
def test_header_layout(spec: str) -> None:
    payload = get_codec(spec).encode(X)
    head = bytes(payload.data[:HEADER_NBYTES].tolist())
    assert head[:2] == MAGIC and head[2] == 1
    assert int.from_bytes(head[8:16], "little") == 37


@pytest.mark.parametrize("spec", DEFAULT_SPECS)
def test_truncated_or_padded_payload_fails(spec: str) -> None:
    codec = get_codec(spec)
    payload = codec.encode(X)
    for data in (payload.data[:-1], payload.data[:10], payload.data[:0],
                 torch.cat([payload.data, torch.zeros(1, dtype=torch.uint8)])):
        with pytest.raises(CodecError, match="truncated|bytes"):
            codec.decode(Payload(data, payload.shape))


@pytest.mark.parametrize("spec", DEFAULT_SPECS)
def test_wrong_codec_fails(spec: str) -> None:
    payload = get_codec(spec).encode(X)
    for other in DEFAULT_SPECS:
        if other != spec:
            with pytest.raises(CodecError, match="different codec"):
                get_codec(other).decode(payload)


def test_wrong_shape_and_foreign_bytes_fail() -> None:
    codec = get_codec("bits:s0e2+2m0")
    payload = codec.encode(X)
    with pytest.raises(CodecError, match="holds 37 values"):
        codec.decode(Payload(payload.data, torch.Size([36])))
    with pytest.raises(CodecError, match="no approxdist header"):
        codec.decode(Payload(torch.zeros(payload.wire_bytes, dtype=torch.uint8), payload.shape))
    with pytest.raises(CodecError, match="1-D uint8"):
        codec.decode(Payload(payload.data.float(), payload.shape))


def test_misaligned_payload_still_decodes() -> None:
    for spec in ("fp32", "fp16", "table4", "fp8-e5m2", "bits:s1e8m23", "bits:s1e8m10",
                 "bits:s1e8m7", "bits:auto4"):
        codec = get_codec(spec)
        data = codec.encode(X).data
        shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), data])[1:]
        assert torch.equal(codec.decode(Payload(shifted, X.shape)), codec.decode(Payload(data,
                                                                                         X.shape)))


@pytest.mark.parametrize("spec", DEFAULT_SPECS)
def test_every_codec_handles_any_shape_and_layout(spec: str) -> None:
    base = torch.randn(40, 30, generator=torch.Generator().manual_seed(1))
    for x in (base.t(), base[:, ::3], base[:7, :1], torch.empty(0, 5), torch.tensor(0.25)):
        codec, twin = get_codec(spec), get_codec(spec)
        payload = codec.encode(x)
        assert payload.shape == x.shape and payload.wire_bytes == codec.payload_nbytes(x.numel())
        y = codec.decode(payload)
        assert y.shape == x.shape and y.dtype == torch.float32
        same = twin.decode(twin.encode(x.contiguous()))
        assert torch.equal(y.view(torch.int32), same.view(torch.int32))
