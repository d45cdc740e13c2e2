"""A preset's report on a task other than its default states this run's numbers, not the
default task's: seed000-bandwidth at smoke size on synthetic data with a wider cut, its
explanation checked against its own CSV (bytes per sample at the cut, the link rate below
which the link dominates), and none of the default task's figures in the text."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from approxdist.experiments import Settings, run_experiment
from approxdist.experiments import seed000_bandwidth as bw
from approxdist.experiments.base import Settings as BaseSettings
from approxdist.experiments.csvio import read_csv
from approxdist.experiments.task import Task

BATCH = 32


def _other_task(settings: BaseSettings) -> Task:
    return Task(key="synthetic", dataset="synthetic", model={"name": "mlp", "hidden": 48,
                                                             "depth": 2},
                split="1", epochs=1, batch_size=BATCH, lr=0.05,
                cut="after the first hidden layer: 48 values per sample (post-ReLU)",
                why="synthetic vectors: a second task for the report test",
                extra_data={"synthetic_shape": [20], "synthetic_samples": 256,
                            "augment": False})


def test_the_bandwidth_report_quotes_its_own_run(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bw, "task_for", _other_task)
    monkeypatch.setattr(bw, "links", lambda settings: ["1gbit", "2mbit"])
    report = run_experiment("seed000-bandwidth", Settings(tmp_path, size="smoke"))
    text = report.read_text()
    rows = read_csv(tmp_path / "bandwidth.csv", bw.COLUMNS)
    fast = max((r for r in rows if r["config"] == "fp32"), key=lambda r: r["bw_bps"])
    per_sample = float(fast["bytes_fwd_per_step"]) / BATCH
    assert per_sample == pytest.approx(48 * 4)  # 48 fp32 values per sample cross the cut
    crossover = bw._crossover_bps(rows)
    assert math.isfinite(crossover) and crossover > 0
    assert (f"our cut carries {per_sample:.0f} B per sample forward" in text
            or f"reaches its compute-bound step time only below {bw._rate_text(crossover)}"
            in text)
    assert bw._rate_text(crossover) in text
    for stale in ("640 B", "4 channels", "2-core", "13 MB"):
        assert stale not in text
