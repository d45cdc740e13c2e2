"""Bit-field codecs `bits:s?e?m?`: exactly the kept bits survive, real packing, spec parsing."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from approxdist.comm.codecs import get_codec
from approxdist.comm.codecs.bitfield import BitFieldCodec
from approxdist.comm.codecs.header import HEADER_NBYTES
from approxdist.errors import SpecError

#: the six schemes of seed 000 (name in the paper -> spec) and their widths
SEED_SCHEMES = {"bits:s0e8m0": 8, "bits:s0e1m0": 1, "bits:s1e0m7": 8, "bits:s1e1m0": 2,
                "bits:s1e6m1": 8, "bits:s0e2+2m0": 4}


def kept_positions(sign: int, top: int, bottom: int, mantissa: int) -> list[int]:
    """fp32 bit positions a spec keeps, written out independently of the codec."""
    return ([31] * sign + list(range(30, 30 - top, -1)) + list(range(22 + bottom, 22, -1))
            + list(range(22, 22 - mantissa, -1)))


def reference(bits: list[int], positions: list[int]) -> list[int]:
    """Each value keeps exactly the bits at `positions`, bit by bit; the rest are 0."""
    out = []
    for v in bits:
        u = v & 0xFFFFFFFF
        kept = sum(((u >> p) & 1) << p for p in set(positions))
        out.append(kept - (1 << 32) if kept >= 1 << 31 else kept)
    return out


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, int, int]:
    sign, top = draw(st.integers(0, 1)), draw(st.integers(0, 8))
    bottom = draw(st.integers(0, 8 - top))
    mantissa = draw(st.integers(0, 23))
    if sign + top + bottom + mantissa == 0:
        mantissa = 1
    return sign, top, bottom, mantissa


@settings(max_examples=120, deadline=None)
@given(layouts(), st.lists(st.integers(-(1 << 31), (1 << 31) - 1), max_size=40))
def test_bitfield_keeps_exactly_the_kept_bits(layout: tuple[int, int, int, int],
                                             bits: list[int]) -> None:
    sign, top, bottom, mantissa = layout
    spec = f"bits:s{sign}e{top}+{bottom}m{mantissa}"
    codec = get_codec(spec)
    x = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    payload = codec.encode(x)
    width = sign + top + bottom + mantissa
    assert codec.bits_per_value == width
    assert payload.wire_bytes == HEADER_NBYTES + (len(bits) * width + 7) // 8
    y = codec.decode(payload)
    assert y.view(torch.int32).tolist() == reference(bits, kept_positions(*layout))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(1 << 31), (1 << 31) - 1), max_size=60))
def test_s1e8m23_is_bit_exact(bits: list[int]) -> None:
    x = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    codec = get_codec("bits:s1e8m23")
    assert codec.lossless
    assert codec.decode(codec.encode(x)).view(torch.int32).tolist() == x.view(torch.int32).tolist()


@pytest.mark.parametrize(("spec", "width"), SEED_SCHEMES.items())
def test_seed_schemes_are_really_packed(spec: str, width: int) -> None:
    x = torch.randn(100_001, generator=torch.Generator().manual_seed(0))
    codec = get_codec(spec)
    payload = codec.encode(x)
    assert payload.wire_bytes == HEADER_NBYTES + (100_001 * width + 7) // 8
    fp32_bytes = get_codec("fp32").encode(x).wire_bytes
    assert fp32_bytes / payload.wire_bytes > 0.99 * 32 / width  # e.g. 8x less for 4 bits


def test_four_bit_scheme_on_known_values() -> None:
    # exponent 128 (2.0) = 1000_0000: top 10, bottom 00 -> kept; 1.0 = 0111_1111 -> 0100_0011
    x = torch.tensor([2.0, 3.0, 0.0, -0.0, 1.0, 16.0])
    y = get_codec("bits:s0e2+2m0").decode(get_codec("bits:s0e2+2m0").encode(x))
    assert y[:4].tolist() == [2.0, 2.0, 0.0, 0.0]
    assert y[4].item() == 2.0 ** (0b01000011 - 127)
    assert y[5].item() == 16.0


def test_special_values() -> None:
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40])
    y = get_codec("bits:s1e8m0").decode(get_codec("bits:s1e8m0").encode(x))
    assert y[0].item() == float("inf")  # NaN loses its mantissa: exponent 255 -> Inf
    assert y[1:3].tolist() == [float("inf"), -float("inf")]
    assert str(y[3].item()) == "-0.0" and y[4].item() == 0.0  # subnormal without mantissa
    nan = get_codec("bits:s1e8m1").decode(get_codec("bits:s1e8m1").encode(x[:1]))
    assert nan.isnan().all()


def test_chunked_and_unchunked_agree() -> None:
    x = torch.randn(100_003, generator=torch.Generator().manual_seed(4)) * 100
    for spec in ("bits:s1e6m1", "bits:s0e2+2m0", "bits:s1e8m10", "bits:s0e3m0"):
        whole, parts = get_codec(spec), get_codec(spec)
        assert isinstance(parts, BitFieldCodec)
        parts.chunk = 1024
        a, b = whole.encode(x), parts.encode(x)
        assert torch.equal(a.data, b.data)
        assert torch.equal(parts.decode(a).view(torch.int32), whole.decode(b).view(torch.int32))


def test_one_and_several_threads_give_the_same_bytes() -> None:
    """One thread: chunked arithmetic; several: whole-tensor lookups. Same payloads."""
    x = torch.randn((1 << 20) + 3, generator=torch.Generator().manual_seed(5)) * 10
    old = torch.get_num_threads()
    try:
        for spec in ("bits:s0e2+2m0", "bits:s1e6m1", "bits:s0e8m0", "bits:s1e0m7",
                     "bits:auto4", "table4"):
            torch.set_num_threads(1)
            a = get_codec(spec).encode(x)
            torch.set_num_threads(2)
            b = get_codec(spec).encode(x)
            assert torch.equal(a.data, b.data), spec
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize(("text", "canonical"), [
    ("bits:s0e2+2m0", "bits:s0e2+2m0"), ("BITS:S1E8M23", "bits:s1e8m23"),
    ("bits:s0e4+4m0", "bits:s0e8m0"), ("bits:s1e3+0m2", "bits:s1e3m2"),
    (" bits:s0e0+2m1 ", "bits:s0e0+2m1")])
def test_spec_canonical(text: str, canonical: str) -> None:
    assert get_codec(text).spec == canonical


@pytest.mark.parametrize(("bad", "hint"), [
    ("bits:s2e1m0", "valid forms"), ("bits:s0e5+4m0", "at most 8 exponent"),
    ("bits:s1e8m24", "at most 23 mantissa"), ("bits:s0e0m0", "keeps no bit"),
    ("bits", "bits:s<0|1>e<N|A+B>m<M>"), ("", "non-empty"), ("fp64", "table<N>")])
def test_bad_specs_name_the_fix(bad: str, hint: str) -> None:
    with pytest.raises(SpecError, match=hint.replace("|", r"\|").replace("+", r"\+")) as err:
        get_codec(bad)
    assert "\n" not in str(err.value)
