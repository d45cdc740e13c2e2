"""Fused C bit-field kernels: the same bytes and bits as the torch ops, and a clean fallback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from approxdist.comm.codecs import get_codec
from approxdist.comm.codecs.base import Payload
from approxdist.comm.codecs.bitfield import BitFieldCodec, BitLayout
from approxdist.kernels import kernel_status
from tests.unit.test_codec_bits import layouts  # the same random layouts as the codec's own tests

needs_kernels = pytest.mark.skipif(not kernel_status().available,
                                   reason=f"C kernels unavailable: {kernel_status().detail}")

#: lengths around the kernel's 2048-value blocks and every sub-byte group size
LENGTHS = [0, 1, 3, 7, 8, 9, 2047, 2048, 2049, 5003]


def pair(sign: int, top: int, bottom: int, mantissa: int) -> tuple[BitFieldCodec, BitFieldCodec]:
    layout = BitLayout(sign, top, bottom, mantissa)
    return BitFieldCodec(layout), BitFieldCodec(layout, use_kernels=False)


def values(n: int, seed: int) -> torch.Tensor:
    """Normal values over many magnitudes, with zeros, infinities and NaN bit patterns."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 8)
    if n > 4:
        x[:4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")])
    return x


@needs_kernels
@settings(max_examples=60, deadline=None)
@given(layouts(), st.sampled_from(LENGTHS), st.integers(0, 1000))
def test_kernel_bytes_and_values_equal_the_torch_ops(layout: tuple[int, int, int, int], n: int,
                                                      seed: int) -> None:
    fused, ops = pair(*layout)
    x = values(n, seed)
    payload = fused.encode(x)
    assert torch.equal(payload.data, ops.encode(x).data), "encoded bytes differ"
    y_fused, y_ops = fused.decode(payload), ops.decode(payload)
    assert torch.equal(y_fused.view(torch.int32), y_ops.view(torch.int32)), "decoded bits differ"
    assert torch.equal(y_fused.view(torch.int32), ops.roundtrip(x).view(torch.int32))


@needs_kernels
@pytest.mark.parametrize("spec", [(0, 2, 2, 0), (1, 8, 0, 7), (1, 3, 0, 2), (0, 1, 0, 0),
                                  (1, 5, 0, 10), (1, 4, 0, 6), (1, 8, 0, 23)])
@pytest.mark.parametrize("n", LENGTHS)
def test_decode_add_is_the_same_fp32_sum(spec: tuple[int, int, int, int], n: int) -> None:
    fused, ops = pair(*spec)
    x, dest = values(n, 1), values(n, 2)
    payload = fused.encode(x)
    expected = dest.clone().add_(ops.decode(payload))
    fused.decode_add(payload, dest)
    assert torch.equal(dest.view(torch.int32), expected.view(torch.int32))


def test_decode_add_takes_a_non_contiguous_destination() -> None:
    fused, _ = pair(1, 8, 0, 7)
    base = values(40, 5)
    dest = base[::2]
    x = values(20, 6)
    expected = dest.clone() + fused.decode(fused.encode(x))
    fused.decode_add(Payload(fused.encode(x).data, torch.Size([20])), dest)
    assert torch.equal(dest.view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("spec", ["fp16", "bf16", "bits-without-kernels"])
def test_other_decode_adds_are_decode_then_add(spec: str) -> None:
    """The cast codecs' fused add and the torch-ops fallback give decode-then-add's sums."""
    codec = pair(0, 2, 2, 0)[1] if spec == "bits-without-kernels" else get_codec(spec)
    x, dest = values(3001, 7), values(3001, 8)
    payload = codec.encode(x)
    expected = dest + codec.decode(payload)
    codec.decode_add(payload, dest)
    assert torch.equal(dest.view(torch.int32), expected.view(torch.int32))


def test_codec_with_kernels_pickles_and_still_encodes() -> None:
    import pickle
    fused, ops = pair(0, 2, 2, 0)
    x = values(100, 9)
    fused.encode(x)  # resolves the kernel
    again = pickle.loads(pickle.dumps(fused))
    assert torch.equal(again.encode(x).data, ops.encode(x).data)


def _status_in_subprocess(env: dict[str, str]) -> str:
    code = "from approxdist.kernels import kernel_status; s = kernel_status(); " \
           "print(s.available, s.detail)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120, check=True)
    return proc.stdout.strip()


def test_kernels_can_be_switched_off() -> None:
    out = _status_in_subprocess({"APPROXDIST_KERNELS": "off"})
    assert out.startswith("False") and "APPROXDIST_KERNELS=off" in out


def test_a_failing_compiler_falls_back_with_the_reason(tmp_path: Path) -> None:
    out = _status_in_subprocess({"CC": "false", "APPROXDIST_KERNEL_CACHE": str(tmp_path)})
    assert out.startswith("False") and "kernel build failed" in out
    assert not list(tmp_path.glob("*.tmp")), "a failed build left a temporary file"


@needs_kernels
def test_a_fresh_cache_builds_once_and_reuses_the_library(tmp_path: Path) -> None:
    env = {"APPROXDIST_KERNEL_CACHE": str(tmp_path)}
    first = _status_in_subprocess(env)
    assert first.startswith("True") and str(tmp_path) in first
    built = sorted(tmp_path.glob("*.so"))
    assert len(built) == 1
    mtime = built[0].stat().st_mtime_ns
    assert _status_in_subprocess(env) == first
    assert built[0].stat().st_mtime_ns == mtime, "the cached library was rebuilt"


def test_an_unwritable_cache_falls_back_with_the_reason(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    out = _status_in_subprocess({"APPROXDIST_KERNEL_CACHE": str(blocked / "kernels")})
    assert out.startswith("False") and "kernel build failed" in out
