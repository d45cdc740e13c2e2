"""Table-N (seed 004): table = percentiles of |x|, values rounded to the nearest entry, sign kept."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from approxdist.comm.codecs import get_codec
from approxdist.comm.codecs import table as table_mod
from approxdist.comm.codecs.header import HEADER_NBYTES
from approxdist.comm.codecs.table import TableCodec
from approxdist.errors import SpecError


def table_of(payload_data: torch.Tensor, bits: int) -> torch.Tensor:
    entries = 1 << (bits - 1)
    return payload_data[HEADER_NBYTES:HEADER_NBYTES + 4 * entries].clone().view(torch.float32)


def reference(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seed 004's table (99k/T-th percentiles of finite |x|) and x rounded to it."""
    entries = 1 << (bits - 1)
    q = torch.arange(1, entries + 1, dtype=torch.float64) * 0.99 / entries
    mag = x[torch.isfinite(x)].abs().double()
    table = torch.quantile(mag, q).float() if mag.numel() else torch.zeros(entries)
    mids = ((table[:-1] + table[1:]) / 2).view(torch.int32).long()
    index = torch.searchsorted(mids, x.view(torch.int32).long() & 0x7FFFFFFF, right=True)
    sign = torch.where(x.view(torch.int32) < 0, -1.0, 1.0)
    return table, table[index] * sign


values = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)


@pytest.mark.parametrize("small", [True, False])
@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([1, 2, 3, 4, 8]), xs=st.lists(values, max_size=60))
def test_table_is_percentiles_and_values_round_to_nearest(small: bool, bits: int,
                                                          xs: list[float]) -> None:
    x = torch.tensor(xs, dtype=torch.float32)
    codec = TableCodec(bits)
    codec.chunk = 16
    old = table_mod.SMALL
    table_mod.SMALL = 1 << 30 if small else 0  # binary-search path / 65536-bin path
    try:
        payload = codec.encode(x)
    finally:
        table_mod.SMALL = old
    ref_table, ref_values = reference(x, bits)
    assert torch.equal(table_of(payload.data, bits), ref_table)
    y = codec.decode(payload)
    assert torch.equal(y.view(torch.int32), ref_values.view(torch.int32))
    assert payload.wire_bytes == HEADER_NBYTES + 4 * (1 << (bits - 1)) + (len(xs) * bits + 7) // 8


def test_large_tensor_uses_a_sample_and_stays_nearest() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(300_000, generator=gen), torch.zeros(100_000)])
    codec = get_codec("table4")
    payload = codec.encode(x)
    table = table_of(payload.data, 4)
    q = torch.arange(1, 9, dtype=torch.float64) * 0.99 / 8
    exact = torch.quantile(x.abs().double(), q).float()
    assert torch.allclose(table, exact, rtol=0.05, atol=1e-3)
    y = codec.decode(payload)
    nearest = table[(x.abs().view(-1, 1) - table.view(1, -1)).abs().argmin(dim=1)]
    gap = (y.abs() - nearest).abs()
    assert float(gap.max()) <= float((table[1:] - table[:-1]).max())  # ties only
    assert float((gap > 0).float().mean()) < 1e-4


def test_table1_is_sign_times_99th_percentile() -> None:
    x = torch.linspace(-1, 1, 201)
    y = get_codec("table1").decode(get_codec("table1").encode(x))
    q99 = float(torch.quantile(x.abs().double(), 0.99))
    assert torch.allclose(y.abs(), torch.full_like(y, q99))
    assert torch.equal(y < 0, x.view(torch.int32) < 0)


def test_specials_map_to_the_largest_entry_and_keep_sign() -> None:
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1.0, 2.0])
    codec = get_codec("table2")
    payload = codec.encode(x)
    table = table_of(payload.data, 2)
    y = codec.decode(payload)
    assert y[:3].tolist() == [table[1].item(), table[1].item(), -table[1].item()]
    assert y[3].item() == -table[0].item() and y[4].item() == table[0].item()
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("bad", ["table0", "table13"])
def test_bad_table_specs(bad: str) -> None:
    with pytest.raises(SpecError, match="N must be 1..12"):
        get_codec(bad)
