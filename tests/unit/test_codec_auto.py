"""bits:auto<K>: bits chosen from the observed histogram, constant bits restored, re-calibration."""

from __future__ import annotations

import pytest
import torch

from approxdist.comm.codecs import get_codec
from approxdist.comm.codecs.auto import AutoBitsCodec
from approxdist.comm.codecs.header import HEADER_NBYTES
from approxdist.errors import SpecError


def activations(n: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return torch.relu(torch.randn(n, generator=torch.Generator().manual_seed(seed))) * scale


def sign_exponent(x: torch.Tensor) -> torch.Tensor:
    return (x.view(torch.int32) >> 23) & 0x1FF


def test_constant_bits_are_restored_not_zeroed() -> None:
    x = torch.rand(10_000, generator=torch.Generator().manual_seed(1)) * 0.99 + 1.0  # [1, 2)
    codec = get_codec("bits:auto1")
    y = codec.decode(codec.encode(x))
    assert torch.equal(y, torch.ones_like(x))  # exponent 127 kept exactly, mantissa 0
    fixed = get_codec("bits:s0e1m0")
    assert float(fixed.decode(fixed.encode(x)).max()) == 0.0  # zero fill loses it


def test_covered_values_keep_sign_and_exponent_exactly() -> None:
    g = torch.randn(50_000, generator=torch.Generator().manual_seed(2)) * 1e-3
    codec = AutoBitsCodec(5)
    y = codec.decode(codec.encode(g))
    assert codec.choice is not None
    sent, const = codec.choice.sent, codec.choice.const
    covered = (sign_exponent(g) & ~sent) == const
    assert float(covered.float().mean()) == pytest.approx(codec.coverage, abs=0.02)
    assert torch.equal(sign_exponent(y)[covered], sign_exponent(g)[covered])
    assert torch.equal(y.view(torch.int32)[covered] & 0x7FFFFF,
                       torch.zeros_like(y.view(torch.int32)[covered]))
    assert codec.bits_per_value == 5
    assert codec.encode(g).wire_bytes == HEADER_NBYTES + 4 + (50_000 * 5 + 7) // 8


def test_beats_zero_fill_on_relu_activations() -> None:
    x = activations(100_000)
    auto, fixed = get_codec("bits:auto4"), get_codec("bits:s0e2+2m0")
    err_auto = (auto.decode(auto.encode(x)) - x).abs().mean()
    err_fixed = (fixed.decode(fixed.encode(x)) - x).abs().mean()
    assert err_auto < 0.5 * err_fixed


def test_uncovered_values_go_to_the_nearest_representable_value() -> None:
    x = activations(20_000)
    codec = AutoBitsCodec(2)
    y = codec.decode(codec.encode(x))
    assert codec.choice is not None
    reps = codec.choice.values().double()
    binade = (sign_exponent(x) << 23).view(torch.float32).double()  # 2**e: mantissa dropped
    typical = binade * 2 ** 0.5  # the middle of the binade, in log scale
    expect = reps[(typical.view(-1, 1) - reps.view(1, -1)).abs().argmin(dim=1)].float()
    assert torch.equal(y[x > 0], expect[x > 0])
    exact = (sign_exponent(x) & ~codec.choice.sent) == codec.choice.const
    assert torch.equal(y[exact], binade[exact].float())


def test_receiver_needs_no_calibration() -> None:
    x = activations(5000, scale=10.0)
    payload = AutoBitsCodec(4).encode(x)
    sender_view = AutoBitsCodec(4)
    assert torch.equal(sender_view.decode(payload), get_codec("bits:auto4").decode(payload))


def test_recalibrates_only_when_coverage_drops() -> None:
    codec = AutoBitsCodec(3)
    codec.encode(activations(10_000, seed=1))
    codec.encode(activations(10_000, seed=2))  # same distribution
    assert codec.calibrations == 1
    codec.encode(activations(10_000, seed=3, scale=1e-6))  # every exponent moves
    assert codec.calibrations == 2
    codec.calibrate(activations(100, seed=4))
    assert codec.calibrations == 3


def test_empty_and_special_values() -> None:
    codec = get_codec("bits:auto4")
    assert codec.decode(codec.encode(torch.empty(0))).numel() == 0
    x = torch.tensor([float("nan"), float("inf"), -0.0, 0.0, 1.0, 1.5, -1.0, 3e-40])
    y = codec.decode(codec.encode(x))
    assert y.shape == x.shape and y[4].item() == 1.0


@pytest.mark.parametrize("bad", ["bits:auto0", "bits:auto10"])
def test_bad_auto_specs(bad: str) -> None:
    with pytest.raises(SpecError, match="K must be 1..9"):
        get_codec(bad)
