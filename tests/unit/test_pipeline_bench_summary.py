"""`approxdist bench pipeline`'s summary: ratio of medians and the paired per-round ratio."""

from __future__ import annotations

import pytest

from approxdist.benchmarks.pipeline import BenchCase
from approxdist.cli.bench_pipeline import summarize, table


def test_rows_carry_rates_ratios_and_the_paired_ratio() -> None:
    """Load rises during the run and slows both engines alike; ours is 10 % faster in
    every round: both ratios say 1.1."""
    torch_t = [1.0, 1.0, 2.0, 3.0, 3.0]
    ours_t = [t / 1.1 for t in torch_t]
    case = BenchCase("mlp", (16,), 2, 4, "gpipe", batch_size=8)
    per_rank = [[{"rounds": {"approxdist": ours_t, "torch": torch_t}, "bubble": 0.25,
                  "weight_copy_bytes": 1000}]] * 2
    rows = summarize([case], per_rank, steps=2)
    ours, torch_row = rows
    # both ranks copied 1000 bytes over 5 rounds of 2 steps
    assert ours["weight_copy_bytes_per_step"] == 200 and torch_row["weight_copy_bytes_per_step"] is None
    assert ours["paired_ratio"] == pytest.approx(1.1) and torch_row["paired_ratio"] == 1.0
    assert ours["samples_per_s"] == pytest.approx(2 * 8 / (2.0 / 1.1))
    assert ours["ratio_vs_torch"] == pytest.approx(1.1)
    assert "1.100x" in table(rows)


def test_paired_ratio_pairs_rounds_not_sorted_times() -> None:
    torch_t = [1.0, 3.0, 2.0]
    ours_t = [2.0, 1.5, 2.0]  # per round: 0.5, 2.0, 1.0 -> median 1.0
    case = BenchCase("mlp", (16,), 2, 4, "1f1b", batch_size=8)
    rows = summarize([case], [[{"rounds": {"approxdist": ours_t, "torch": torch_t},
                                "bubble": 0.2, "weight_copy_bytes": 0}]], steps=1)
    assert rows[0]["paired_ratio"] == pytest.approx(1.0)
    assert rows[0]["ratio_vs_torch"] == pytest.approx(2.0 / 2.0)
