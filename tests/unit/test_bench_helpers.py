"""The benchmark helpers every `approxdist bench` shares: statistics, interleaving, tables, JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from approxdist.bench.host import HostWatch
from approxdist.bench.report import (
    Column,
    check_counts,
    finish,
    ratio,
    render,
    scaled,
    with_steal,
)
from approxdist.bench.stats import fastest, median, p10, paired_ratio, slowest
from approxdist.bench.timing import interleave, timed
from approxdist.cli.main import main
from approxdist.errors import ConfigError


def test_statistics() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0 and math.isnan(median([]))
    assert p10(list(range(1, 21))) == 2 and p10([5.0]) == 5.0
    assert paired_ratio([2.0, 3.0, 8.0], [1.0, 3.0, 2.0]) == 2.0  # median of 2, 1, 4
    per_rank = [[1.0, 5.0, 2.0], [3.0, 4.0, 2.5]]
    assert slowest(per_rank) == [3.0, 5.0, 2.5] and fastest(per_rank) == [1.0, 4.0, 2.0]


def test_interleave_runs_every_variant_in_turn_and_alternates() -> None:
    calls: list[str] = []
    ops = {name: (lambda n=name: calls.append(n)) for name in ("ours", "base")}
    times = interleave(ops, rounds=2, per_round=2, warmup=1, alternate=True)
    assert calls == ["ours", "base",                       # warm-up
                     "ours", "ours", "base", "base",       # round 0
                     "base", "base", "ours", "ours"]       # round 1, the other order first
    assert {k: len(v) for k, v in times.items()} == {"ours": 4, "base": 4}
    synced: list[int] = []
    assert timed(lambda: None, lambda: synced.append(1)) >= 0.0 and synced == [1, 1]


def test_tables_and_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    columns = (Column("name", 6, "name", left=True), Column("ms", 6, "ms", ".1f"),
               Column("x", 4, show=lambda r: f"{r['x']:.1f}x"))
    rows = [{"name": "ours", "ms": 1.25, "x": 0.5}, {"name": "base", "ms": None, "x": 1.0}]
    assert render(columns, rows, rule=True).splitlines() == [
        "name       ms    x", "------------------", "ours      1.2 0.5x", "base        - 1.0x"]
    assert [ratio("x", ".3f")(r) for r in rows] == ["0.500x", "1.000x"]
    assert ratio("nope")(rows[0]) == "-" and ratio("x")(rows[1]) == "1.00x"
    assert scaled("ms", 1e3, ".0f")(rows[0]) == "1250" and scaled("ms", 1e3, ".0f")(rows[1]) == "-"
    host = HostWatch(path=tmp_path / "no-such-stat")
    with host:
        pass
    assert with_steal(rows, host)[0] == {**rows[0], "host_steal_fraction": None}
    out = tmp_path / "sub" / "rows.json"
    finish(host, rows, out, "approxdist bench x --y 1")
    printed = capsys.readouterr().out
    assert "stolen by the hypervisor during the run unknown" in printed
    assert "reproduce: approxdist bench x --y 1" in printed
    assert json.loads(out.read_text())[1]["host_steal_fraction"] is None


def test_bad_counts_name_the_flag() -> None:
    assert main(["bench", "dp", "--steps", "0"]) == 2
    with pytest.raises(ConfigError, match="--rounds 0 must be >= 1"):
        check_counts(rounds=0, steps=3)


def test_bench_trace_measures_every_case_against_its_baseline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace.json"
    assert main(["bench", "trace", "--calls", "200", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert rows[0]["case"].startswith("baseline") and rows[0]["ratio_vs_baseline"] == 1.0
    assert len(rows) == 7 and all(r["ns_per_span"] > 0 for r in rows)
    assert "reproduce: approxdist bench trace --calls 200" in capsys.readouterr().out
    assert main(["bench", "trace", "--calls", "0"]) == 2


def test_bench_stage_times_every_variant_against_fused_1f1b(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "stage.json"
    assert main(["bench", "stage", "--width", "16", "--layers", "2", "--rows", "2",
                 "--rounds", "1", "--steps", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["schedule"], r["fusion"]) for r in rows] == [
        ("1f1b", "all"), ("1f1b", "off"), ("zbh1", "all"), ("zbh1", "off")]
    assert rows[0]["vs_base"] == 1.0 and all(r["step_s"] > 0 for r in rows)
    assert "reproduce: approxdist bench stage --width 16" in capsys.readouterr().out
    assert main(["bench", "stage", "--stage", "2"]) == 2
