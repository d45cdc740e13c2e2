"""`approxdist analyze RUN_DIR` on a run directory holding a simulated pipeline trace."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from approxdist.cli import analyze_cmd
from approxdist.trace import TraceError
from approxdist.trace.chrome import write_trace_file
from tests.helpers.schedule_trace import schedule_trace


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="approxdist")
    analyze_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["analyze", *argv])
    return int(args.func(args))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    write_trace_file(schedule_trace("gpipe", 2, 4, comm_s=0.1e-3, nbytes=4096), run / "trace.json")
    (run / "config.toml").write_text('[train]\nparallel = "pipeline"\n\n'
                                     '[pipeline]\nstages = 2\nmicrobatches = 4\nschedule = "gpipe"\n')
    record = {"kind": "epoch", "epoch": 1, "step_time_s": 0.012, "samples_per_s": 5000.0,
              "bytes_sent": {"0->1": 16384, "1->0": 16384}}
    (run / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    return run


def test_analyze_prints_tables_writes_json_and_chart(run_dir: Path, capsys) -> None:
    out_json = run_dir / "figures.json"
    assert _run(str(run_dir), "--json", str(out_json)) == 0
    text = capsys.readouterr().out
    for expected in ("per rank", "compute", "bubble", "per link and direction", "0->1",
                     "slowest stage: rank", "theory (P-1)/(M+P-1) = 1/5 = 0.200",
                     "metrics.jsonl, epoch 1: step 12.00 ms"):
        assert expected in text
    figures = json.loads(out_json.read_text())
    assert figures["pipeline"] == {"stages": 2, "microbatches": 4, "schedule": "gpipe"}
    for rank in figures["ranks"]:
        total = rank["compute"] + rank["comm"] + rank["waiting"] + rank["bubble"]
        assert total == pytest.approx(1.0)
    assert {(k["src"], k["dst"]): k["nbytes"] for k in figures["links"]} == {
        (0, 1): 16384, (1, 0): 16384}
    png = (run_dir / "timeline.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000


def test_analyze_options_override_the_config(run_dir: Path, tmp_path: Path, capsys) -> None:
    png = tmp_path / "chart.png"
    assert _run(str(run_dir), "--microbatches", "8", "--png", str(png), "--chart-steps", "0") == 0
    assert "M=8): theory (P-1)/(M+P-1) = 1/9" in capsys.readouterr().out
    assert png.stat().st_size > 0


def test_analyze_merges_rank_files_when_trace_json_is_missing(tmp_path: Path, capsys) -> None:
    trace = schedule_trace("1f1b", 2, 2)
    for rank in (0, 1):
        part = {**trace, "traceEvents": [e for e in trace["traceEvents"] if e["pid"] == rank],
                "otherData": {"ranks": {str(rank): trace["otherData"]["ranks"][str(rank)]}}}
        write_trace_file(part, tmp_path / f"trace.rank{rank}.json")
    assert _run(str(tmp_path), "--no-png") == 0
    out = capsys.readouterr().out
    assert "2 ranks" in out and "(1f1b, P=2, M=2)" in out  # shape recorded in the trace
    assert not (tmp_path / "timeline.png").exists()


def test_analyze_names_a_missing_run_dir(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="does not exist"):
        _run(str(tmp_path / "nope"))


def test_the_congested_rank_and_link_are_named() -> None:
    """Seed 002's congested stage: the rank that waited longest on links in flight."""
    from approxdist.analysis.bottleneck import Analysis, RankFigures
    from approxdist.analysis.report import congestion

    def rank(r: int, waits: dict[str, float]) -> RankFigures:
        return RankFigures(r, 1.0, 4, 0.5, 0.1, 0.2, 0.2, waits_on=waits)

    ranks = [rank(0, {"1->0": 0.01}), rank(3, {"0->3": 0.02, "1->3": 0.05, "2->3": 0.03}),
             rank(1, {})]
    assert congestion(Analysis(ranks, [], 3, None)) == {
        "rank": 3, "waited_s": pytest.approx(0.10), "link": "1->3", "link_s": 0.05}
    assert congestion(Analysis([rank(0, {})], [], 0, None)) is None
