"""A report says how much of its preset's runs an invocation reused from earlier ones."""

from __future__ import annotations

import json
import os
from pathlib import Path

from approxdist.experiments.runner import reused_runs
from approxdist.experiments.runs import used_since


def _run(out: Path, name: str, wall_s: float, summary_at: float, used_at: float) -> None:
    run = out / "runs" / name
    run.mkdir(parents=True)
    summary = run / "summary.json"
    summary.write_text(json.dumps({"wall_time_s": wall_s}))
    os.utime(summary, (summary_at, summary_at))
    os.utime(run, (used_at, used_at))


def test_trained_reused_and_left_over_runs_are_told_apart(tmp_path: Path) -> None:
    since = 1_000_000.0
    _run(tmp_path, "trained", 30.0, since + 50, since + 50)
    _run(tmp_path, "reused", 600.0, since - 5000, since + 10)  # finished earlier, used now
    _run(tmp_path, "other-size", 99.0, since - 9000, since - 9000)  # not used at all
    runs = used_since(tmp_path, since)
    assert runs == {"trained": 1, "reused": 1, "train_s": 630.0}
    line = reused_runs(runs)
    assert "trained 1 runs and reused 1" in line and "took 630 s" in line


def test_an_invocation_that_reused_nothing_says_nothing_more(tmp_path: Path) -> None:
    _run(tmp_path, "trained", 30.0, 2_000_000.0, 2_000_000.0)
    runs = used_since(tmp_path, 1_000_000.0)
    assert runs["reused"] == 0 and reused_runs(runs) == "" and reused_runs(None) == ""
    assert used_since(tmp_path / "none", 0.0) == {"trained": 0, "reused": 0, "train_s": 0.0}
