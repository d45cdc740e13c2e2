"""`bench.host`: the hypervisor's steal share from /proc/stat counters."""

from __future__ import annotations

from pathlib import Path

import pytest

from approxdist.bench.host import CpuTimes, HostWatch, parse_cpu_times, steal_fraction

STAT = """cpu  100 5 50 800 10 0 5 30 0 0
cpu0 50 2 25 400 5 0 2 15 0 0
intr 12345
"""


def test_parse_sums_the_first_eight_fields_and_takes_steal() -> None:
    assert parse_cpu_times(STAT) == CpuTimes(total=1000, steal=30)
    assert parse_cpu_times("cpu0 1 2 3\n") is None  # no aggregate line
    assert parse_cpu_times("cpu  1 2 x 4 5 6 7 8\n") is None
    assert parse_cpu_times("cpu  1 2 3\n") is None  # a kernel without steal


def test_steal_fraction_between_two_readings() -> None:
    assert steal_fraction(CpuTimes(1000, 30), CpuTimes(1200, 80)) == pytest.approx(0.25)
    assert steal_fraction(None, CpuTimes(1, 0)) is None
    assert steal_fraction(CpuTimes(5, 0), CpuTimes(5, 0)) is None  # no time passed


def test_watch_reads_before_and_after(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    with HostWatch(stat) as host:
        stat.write_text(STAT.replace("cpu  100 5 50 800 10 0 5 30", "cpu  150 5 50 900 10 0 5 80"))
    assert host.steal == pytest.approx(50 / 200)
    assert "25 %" in host.line()
    with HostWatch(tmp_path / "missing") as none:
        pass
    assert none.steal is None and "unknown" in none.line()
