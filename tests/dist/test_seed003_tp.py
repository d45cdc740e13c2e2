"""`seed003-tp` end to end on two tiny real runs (2 gloo ranks, the digits' MLP, one epoch):
the preset's format and error feedback reach the tp wire, its rows reach the CSVs, and
the report renders with what is missing marked "not measured".

The whole smoke size (8 runs, ~2 min on 2 cores) is not run here; its tables and
verdicts are tested on made-up rows in tests/unit/test_seed003_tp.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from approxdist.experiments import Settings, run_experiment
from approxdist.experiments import seed003_tp as preset
from approxdist.experiments.csvio import read_csv
from approxdist.experiments.seed003_tp_report import ACCURACY_COLUMNS, LINK_COLUMNS
from approxdist.train.metrics import read_jsonl


def test_one_accuracy_run_and_one_link_run_reach_the_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = preset.Run("tensor", "fwd", "fp8-e4m3", True)
    monkeypatch.setattr(preset, "runs", lambda settings: [run])
    monkeypatch.setattr(preset, "link_formats", lambda settings: ("bf16",))
    report = run_experiment(preset.NAME, Settings(tmp_path, size="smoke"))

    (row,) = read_csv(tmp_path / "accuracy.csv", ACCURACY_COLUMNS)
    assert (row["task"], row["parallel"], row["direction"], row["codec"]) == \
        ("digits", "tensor", "fwd", "fp8-e4m3")
    assert (row["bits_per_value"], row["error_feedback"], row["epochs"]) == (8, 1, 1)
    assert 0 < row["test_accuracy"] <= 1 and row["bytes_per_step"] > 0
    wires = next(r for r in read_jsonl(tmp_path / "runs" / run.slug("digits", 0) /
                                       "metrics.jsonl") if r.get("kind") == "wires")
    assert wires["wires"] == {"tp_fwd": "fp8-e4m3", "tp_bwd": "fp32"}
    config = (tmp_path / "runs" / run.slug("digits", 0) / "config.toml").read_text()
    assert '[wire.tp_fwd]\ncodec = "fp8-e4m3"\nchannel = ""\nerror_feedback = true' in config

    (link,) = read_csv(tmp_path / "link.csv", LINK_COLUMNS)
    assert (link["link"], link["codec"], link["bits_per_value"]) == ("bw=100mbit", "bf16", 16)
    assert link["steps"] > 0 and link["step_time_s"] > 0
    timed = tmp_path / "runs" / f"link-{preset.Run('tensor', 'fwd', 'bf16').slug('digits', 0)}"
    assert 'link = "bw=100mbit"' in (timed / "config.toml").read_text()

    text = report.read_text()
    assert "| `fp8-e4m3` | 8 | - | " in text  # no fp32 reference: no change to show
    assert text.count("| - | not measured |") == 5
    assert json.loads((tmp_path / "experiment.json").read_text())["tasks"]["digits"]
