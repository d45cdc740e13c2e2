"""Fused C Table-N kernels: the same bytes, values and sums as the torch path (its oracle)."""

from __future__ import annotations

import pickle

import pytest
import torch

import approxdist.kernels.table as table_kernels
from approxdist.comm.codecs.table import SMALL, TableCodec, percentile_table
from approxdist.kernels import kernel_status
from approxdist.kernels.table import TableKernel

needs_kernels = pytest.mark.skipif(not kernel_status().available,
                                   reason=f"C kernels unavailable: {kernel_status().detail}")

#: lengths around the kernel's 2048-value blocks and every sub-byte group size
LENGTHS = [0, 1, 3, 7, 8, 9, 2047, 2049, 5003]
SPECIAL = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), -float("nan"), 1e-45, -1e-45,
           3.4e38, -3.4e38, 1.0, -1.0]


def values(n: int, seed: int) -> torch.Tensor:
    """Normal values over many magnitudes, led by zeros, infinities, NaNs and denormals."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 8)
    k = min(n, len(SPECIAL))
    x[:k] = torch.tensor(SPECIAL[:k])
    return x


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def check_pair(fused: TableCodec, ops: TableCodec, x: torch.Tensor) -> None:
    payload = fused.encode(x)
    assert torch.equal(payload.data, ops.encode(x).data), "encoded bytes differ"
    assert same_bits(fused.decode(payload), ops.decode(payload)), "decoded values differ"
    dest = values(x.numel(), 99) * 1e-3
    expected = dest.clone()
    ops.decode_add(payload, expected)
    fused.decode_add(payload, dest)
    assert same_bits(dest, expected), "decode-add sums differ"


@needs_kernels
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 8, 12])
def test_kernels_equal_the_torch_path_bit_for_bit(bits: int) -> None:
    fused, ops = TableCodec(bits), TableCodec(bits, use_kernels=False)
    for n in LENGTHS:
        check_pair(fused, ops, values(n, n + bits))
    assert fused._kernel(values(8, 0)) is not None  # the kernels did run


@needs_kernels
@pytest.mark.parametrize("bits", [2, 4])
def test_large_tensors_match_the_torch_lookup_table_path(bits: int) -> None:
    """Above `SMALL` values the torch path encodes through its 65536-bin tables."""
    check_pair(TableCodec(bits), TableCodec(bits, use_kernels=False), values(SMALL + 13, bits))


@needs_kernels
def test_values_on_the_thresholds_and_degenerate_tables() -> None:
    fused, ops = TableCodec(3), TableCodec(3, use_kernels=False)
    x = torch.arange(1, 2001, dtype=torch.float32) / 100
    table = percentile_table(x, 4)
    mids = (table[:-1] + table[1:]) / 2
    on = torch.cat([mids, -mids, torch.nextafter(mids, torch.zeros(3)), x])
    check_pair(fused, ops, on)
    for constant in (torch.zeros(100), torch.full((100,), -2.5), torch.full((100,), float("nan"))):
        check_pair(fused, ops, constant)


@needs_kernels
def test_chunks_and_non_contiguous_inputs() -> None:
    fused, ops = TableCodec(4), TableCodec(4, use_kernels=False)
    fused.chunk = ops.chunk = 1024
    check_pair(fused, ops, values(5003, 3))
    base = values(6000, 4)
    check_pair(fused, ops, base[::2])


@needs_kernels
def test_the_sorted_sample_is_torch_sort_of_the_finite_magnitudes() -> None:
    kernel = TableKernel.create(4)
    assert kernel is not None
    x = values(70001, 5)
    for step in (1, 3, 5):
        mag = x[::step].abs()
        assert same_bits(kernel.sorted_sample(x, step), torch.sort(mag[torch.isfinite(mag)]).values)
    for entries in (1, 2, 8, 2048):
        assert same_bits(percentile_table(x, entries, kernel), percentile_table(x, entries))


def test_without_the_library_the_codec_uses_torch_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table_kernels, "load_kernels", lambda: None)
    fused = TableCodec(4)
    x = values(3001, 6)
    assert fused._kernel(x) is None
    assert torch.equal(fused.encode(x).data, TableCodec(4, use_kernels=False).encode(x).data)


def test_a_codec_with_kernels_pickles_and_still_encodes() -> None:
    fused = TableCodec(2)
    x = values(100, 7)
    fused.encode(x)  # resolves the kernel
    again = pickle.loads(pickle.dumps(fused))
    assert torch.equal(again.encode(x).data, TableCodec(2, use_kernels=False).encode(x).data)
