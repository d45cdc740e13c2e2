"""Approximate channel `ber:<rate>@<protected>` (seed 000): flips only unprotected code bits."""

from __future__ import annotations

import math

import pytest
import torch

from approxdist.comm.buffers import BufferPool
from approxdist.comm.channel import BitErrorChannel, Channel, flip_positions, get_channel
from approxdist.comm.codecs import get_codec
from approxdist.comm.codecs.bitpack import unpack_codes
from approxdist.errors import SpecError

X = torch.randn(3001, generator=torch.Generator().manual_seed(0))
SPECS = ["fp32", "fp16", "bf16", "fp8-e4m3", "bits:s0e2+2m0", "bits:s1e6m1", "bits:s0e1m0",
         "bits:s1e8m10", "table1", "table4", "bits:auto4"]


def codes_of(data: torch.Tensor, spec: str, n: int) -> torch.Tensor:
    codec = get_codec(spec)
    region = data[codec.codes_offset(n):]
    return unpack_codes(region, codec.code_bits, n, BufferPool()).clone().to(torch.int64)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("protected", [0, 1, 3, 5])
def test_flips_land_only_in_unprotected_bits(spec: str, protected: int) -> None:
    codec = get_codec(spec)
    payload = codec.encode(X)
    bad = get_channel(f"ber:0.3@{protected}").corrupt(payload, codec)
    start = codec.codes_offset(X.numel())
    assert torch.equal(bad.data[:start], payload.data[:start])  # header, scale, table
    width = codec.code_bits
    flips = (codes_of(payload.data, spec, X.numel()) ^ codes_of(bad.data, spec, X.numel()))
    flips &= (1 << width) - 1
    assert int((flips >> max(width - protected, 0)).count_nonzero()) == 0
    if protected < width:
        assert int(flips.count_nonzero()) > 0
        assert payload.data is not bad.data  # a new payload; the sender's stays intact


def test_fp32_is_seed_000_experiment_at_the_requested_rate() -> None:
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(1))
    codec = get_codec("fp32")
    y = codec.decode(get_channel("ber:0.01@5").corrupt(codec.encode(x), codec))
    diff = (x.view(torch.int32) ^ y.view(torch.int32)).to(torch.int64) & 0xFFFFFFFF
    assert int((diff >> 27).count_nonzero()) == 0  # sign + top 4 exponent bits protected
    per_bit = torch.stack([(diff >> b) & 1 for b in range(27)]).sum(dim=1).double()
    n, p = 20_000, 0.01
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    assert abs(float(per_bit.sum()) - 27 * mean) < 5 * sd * math.sqrt(27)
    assert float((per_bit - mean).abs().max()) < 5 * sd  # every unprotected bit, same rate


def test_rate_one_flips_every_unprotected_bit() -> None:
    codec = get_codec("fp32")
    y = codec.decode(get_channel("ber:1@5").corrupt(codec.encode(X), codec))
    diff = (X.view(torch.int32) ^ y.view(torch.int32))
    assert bool((diff == 0x07FFFFFF).all())


def test_seeded_and_reproducible() -> None:
    codec = get_codec("bits:s0e2+2m0")
    payload = codec.encode(X)
    a = get_channel("ber:0.05@1", seed=7).corrupt(payload, codec)
    b = get_channel("ber:0.05@1", seed=7).corrupt(payload, codec)
    assert torch.equal(a.data, b.data)
    ch = get_channel("ber:0.05@1", seed=7)
    ch.corrupt(payload, codec)
    assert not torch.equal(ch.corrupt(payload, codec).data, a.data)  # the stream advances
    gen = torch.Generator().manual_seed(3)
    c = ch.corrupt(payload, codec, torch.Generator().manual_seed(3))
    assert torch.equal(c.data, ch.corrupt(payload, codec, gen).data)


def test_flip_positions_is_a_bernoulli_process() -> None:
    gen = torch.Generator().manual_seed(0)
    pos = flip_positions(1_000_000, 1e-3, gen)
    assert bool((pos[1:] > pos[:-1]).all()) and int(pos.max()) < 1_000_000
    assert abs(pos.numel() - 1000) < 5 * math.sqrt(1000)
    assert flip_positions(10, 1.0, gen).tolist() == list(range(10))


def test_identity_and_zero_rate() -> None:
    codec = get_codec("fp16")
    payload = codec.encode(X)
    for ch in (get_channel(None), get_channel("none"), get_channel(" NONE ")):
        assert type(ch) is Channel and ch.is_identity
        assert ch.corrupt(payload, codec) is payload
    zero = get_channel("ber:0@3")
    assert zero.is_identity and zero.corrupt(payload, codec).data is payload.data
    assert get_channel("ber:1e-3@40").corrupt(payload, codec) is payload  # all protected
    assert isinstance(get_channel("ber:1e-3@5"), BitErrorChannel)


def test_guard_zeroes_and_counts_nonfinite() -> None:
    codec = get_codec("fp32")
    ch = get_channel("ber:0.2@0", seed=1)
    y = codec.decode(ch.corrupt(codec.encode(X), codec))
    expected = int((~torch.isfinite(y)).sum())
    assert expected > 0
    fixed, count = ch.guard(y)
    assert count == expected and bool(torch.isfinite(fixed).all())
    clean, none = ch.guard(torch.ones(3))
    assert none == 0 and torch.equal(clean, torch.ones(3))
    assert Channel().guard(torch.empty(0))[1] == 0


@pytest.mark.parametrize(("bad", "hint"), [("ber:x@5", "valid"), ("ber:2@5", "in \\[0, 1\\]"),
                                           ("ber:1e-3", "valid"), ("noise", "valid"),
                                           ("ber:1e-3@-1", "valid")])
def test_bad_channel_specs(bad: str, hint: str) -> None:
    with pytest.raises(SpecError, match=hint) as err:
        get_channel(bad)
    assert "\n" not in str(err.value)
