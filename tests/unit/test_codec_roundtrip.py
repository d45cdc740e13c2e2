"""`Codec.roundtrip(x)` is exactly what a receiver decodes from `encode(x)` (error feedback uses it)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from approxdist.comm.codecs import get_codec

SPECS = ["fp32", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2", "bits:s0e2+2m0", "bits:s1e6m1",
         "bits:s0e1m0", "bits:s1e0m7", "bits:s1e8m10", "bits:s1e8m23", "table1", "table4",
         "bits:auto4"]
SPECIAL = torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-40, -1e-45, 3.4e38, -3.4e38, 65504.0, 7e4,
                        float("inf"), float("-inf"), float("nan"), 2.0 ** -24, 1.5, -0.75])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


@pytest.mark.parametrize("spec", SPECS)
def test_roundtrip_is_decode_of_encode_bit_for_bit(spec: str) -> None:
    codec = get_codec(spec)
    x = torch.cat([torch.randn(997, generator=torch.Generator().manual_seed(3)) * 10, SPECIAL])
    if spec.startswith(("table", "bits:auto", "fp8")):
        x = x[torch.isfinite(x)]  # data-fitted codecs refuse or clamp non-finite inputs alike
    ref = codec.decode(codec.encode(x))
    assert _same_bits(codec.roundtrip(x), ref)
    out = torch.empty_like(x)
    assert codec.roundtrip(x, out=out) is out and _same_bits(out, ref)
    inplace = x.clone()
    codec.roundtrip(inplace, out=inplace)
    assert _same_bits(inplace, ref)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=64),
       st.sampled_from(["bits:s0e2+2m0", "bits:s1e3+2m2", "bf16", "fp16"]))
def test_fast_paths_match_on_any_floats(values: list[float], spec: str) -> None:
    codec = get_codec(spec)
    x = torch.tensor(values, dtype=torch.float32)
    assert _same_bits(codec.roundtrip(x), codec.decode(codec.encode(x)))
