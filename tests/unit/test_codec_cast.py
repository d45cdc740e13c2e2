"""Cast codecs fp32 / fp16 / bf16 / fp8: bit-exact fp32, torch's own casts, special values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from approxdist.comm.codecs import get_codec
from approxdist.comm.codecs.fp8 import scale_exponent
from approxdist.comm.codecs.header import HEADER_NBYTES
from approxdist.errors import CodecError
from tests.helpers.collective_oracles import FP16, RELATIVE

SPECIALS = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -3e-39,
                         65504.0, 1e5, -1e-8, 1.0, -2.5])


def patterns(bits: list[int]) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-(1 << 31), (1 << 31) - 1), max_size=50))
def test_fp32_round_trip_is_bit_exact(bits: list[int]) -> None:
    x = patterns(bits)
    codec = get_codec("fp32")
    y = codec.decode(codec.encode(x))
    assert torch.equal(y.view(torch.int32), x.view(torch.int32))
    assert codec.lossless


@pytest.mark.parametrize(("spec", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)])
@settings(max_examples=50, deadline=None)
@given(bits=st.lists(st.integers(-(1 << 31), (1 << 31) - 1), max_size=50))
def test_half_casts_match_torch(spec: str, dtype: torch.dtype, bits: list[int]) -> None:
    x = patterns(bits)
    codec = get_codec(spec)
    y = codec.decode(codec.encode(x))
    ref = x.to(dtype).float()
    assert torch.equal(y.isnan(), ref.isnan())
    assert torch.equal(y[~y.isnan()].view(torch.int32), ref[~ref.isnan()].view(torch.int32))


@pytest.mark.parametrize(("spec", "dtype"), [("fp8-e4m3", torch.float8_e4m3fn),
                                             ("fp8-e5m2", torch.float8_e5m2)])
@pytest.mark.parametrize("scale", [1e-6, 1.0, 3e4])
def test_fp8_is_torch_cast_of_power_of_two_scaled_values(spec: str, dtype: torch.dtype,
                                                         scale: float) -> None:
    x = torch.cat([torch.randn(999, generator=torch.Generator().manual_seed(1)) * scale,
                   SPECIALS])
    codec = get_codec(spec)
    payload = codec.encode(x)
    k = int(payload.data[HEADER_NBYTES:HEADER_NBYTES + 4].view(torch.int32))
    finite = x[torch.isfinite(x)]
    assert k == scale_exponent(float(finite.abs().max()), float(torch.finfo(dtype).max))
    ref = (x * 2.0 ** -k).to(dtype).float() * 2.0 ** k
    y = codec.decode(payload)
    assert torch.equal(y.isnan(), ref.isnan())
    assert torch.equal(y[~y.isnan()], ref[~ref.isnan()])
    assert payload.wire_bytes == HEADER_NBYTES + 4 + x.numel()


def test_scaled_e4m3_keeps_small_gradients() -> None:
    g = torch.randn(10000, generator=torch.Generator().manual_seed(2)) * 1e-5
    y = get_codec("fp8-e4m3").decode(get_codec("fp8-e4m3").encode(g))
    assert (g.to(torch.float8_e4m3fn).float() == 0).float().mean() > 0.9  # unscaled flushes
    assert (y == 0).float().mean() < 0.01
    assert float(((y - g).abs() / g.abs()).median()) < 0.07


def test_scale_exponent_puts_amax_in_top_binade() -> None:
    for amax in (1e-30, 0.3, 448.0, 449.0, 1e30):
        k = scale_exponent(amax, 448.0)
        assert 224.0 < amax * 2.0 ** -k <= 448.0
    assert scale_exponent(0.0, 448.0) == 0
    assert scale_exponent(math.inf, 448.0) == 0


@pytest.mark.parametrize("spec", ["fp32", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2"])
def test_shapes_empty_noncontiguous_and_out_buffers(spec: str) -> None:
    codec = get_codec(spec)
    base = torch.randn(6, 5, generator=torch.Generator().manual_seed(3))
    for x in (base.t(), base[:, ::2], torch.empty(0, 3), torch.tensor(1.5), torch.randn(7)):
        payload = codec.encode(x)
        assert payload.wire_bytes == codec.payload_nbytes(x.numel())
        y = codec.decode(payload)
        assert y.shape == x.shape and y.dtype == torch.float32
        u, f = FP16 if spec == "fp16" else RELATIVE[spec]
        absolute = f if spec == "fp16" else f * float(x.abs().max()) if x.numel() else 0.0
        assert bool(((y - x).abs() <= u * x.abs() + absolute).all()), spec
        out = torch.empty(x.numel())
        buf = torch.empty(codec.payload_nbytes(x.numel()), dtype=torch.uint8)
        again = codec.decode(codec.encode(x, out=buf), out=out)
        assert again.data_ptr() == out.data_ptr() and torch.equal(out.view(x.shape), y)


def test_other_float_dtypes_are_cast_and_others_refused() -> None:
    codec = get_codec("fp32")
    x = torch.tensor([1.0, 2.0 ** -30, 3.0], dtype=torch.float64)
    assert torch.equal(codec.decode(codec.encode(x)), x.float())
    assert torch.equal(codec.decode(codec.encode(x.half())), x.half().float())
    with pytest.raises(CodecError, match="x.float"):
        codec.encode(torch.arange(3))


def test_bad_out_buffer_is_refused() -> None:
    codec = get_codec("fp16")
    with pytest.raises(CodecError, match="out="):
        codec.encode(torch.ones(4), out=torch.empty(3, dtype=torch.uint8))
    with pytest.raises(CodecError, match="out="):
        codec.decode(codec.encode(torch.ones(4)), out=torch.empty(5))
