"""`seed003-tp` without training: its plan as configs, its changes and verdicts on made-up
rows, and its report drawn from CSVs alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from approxdist.config.loader import build_config
from approxdist.experiments import render_report
from approxdist.experiments.base import Settings
from approxdist.experiments.csvio import write_csv
from approxdist.experiments.runner import META_FILE
from approxdist.experiments.seed003_tp import FORMATS, LINK, Run, runs, tasks
from approxdist.experiments.seed003_tp_report import (
    ACCURACY_COLUMNS,
    LINK_COLUMNS,
    PLACES,
    finals,
)
from approxdist.experiments.seed003_tp_trends import (
    bian,
    feedback,
    gradients,
    layer_or_cut,
    link_figure,
)
from approxdist.train.check import check_parts

Rows = list[dict[str, Any]]


def _row(parallel: str, direction: str, codec: str, acc: float, seed: int = 0,
         ef: int = 0, task: str = "gpt-tiny") -> dict[str, Any]:
    return {"task": task, "parallel": parallel, "direction": direction, "codec": codec,
            "bits_per_value": 32 if codec == "fp32" else 8, "error_feedback": ef, "seed": seed,
            "epochs": 2, "test_accuracy": acc, "test_loss": 1.0, "train_loss": 1.0,
            "step_time_s": 0.1, "bytes_per_step": 1e6}


def _refs(acc: float = 0.5, seed: int = 0) -> Rows:
    return [_row("tensor", "-", "fp32", acc, seed), _row("pipeline", "-", "fp32", acc, seed)]


def _link(codec: str, step: float, nbytes: float) -> dict[str, Any]:
    return {"task": "gpt-tiny", "link": LINK, "codec": codec, "bits_per_value": 8, "seed": 0,
            "steps": 10, "step_time_s": step, "bytes_per_step": nbytes, "test_accuracy": 0.5}


@pytest.mark.parametrize("size", ["smoke", "quick"])
def test_every_run_is_a_valid_config_with_the_format_on_its_wire(size: str,
                                                                  tmp_path: Path) -> None:
    settings = Settings(tmp_path, size=size)
    for task in tasks(settings):
        for run in runs(settings):
            cfg = build_config(run.sections(task, 0))
            assert check_parts(cfg).name == run.parallel
            if run.parallel == "pipeline":
                assert (cfg.wire.fwd.codec, cfg.wire.bwd.codec) == (run.codec, "fp32")
                continue
            mine = cfg.wire.tp_fwd if run.direction == "fwd" else cfg.wire.tp_bwd
            other = cfg.wire.tp_bwd if run.direction == "fwd" else cfg.wire.tp_fwd
            assert (mine.codec, mine.error_feedback) == (run.codec, run.feedback)
            assert (other.codec, other.error_feedback) == ("fp32", False)
            assert (cfg.tp.size, cfg.train.world_size) == (2, 2)
        timed = build_config(Run("tensor", "fwd", "bf16").sections(task, 0, LINK, epochs=1))
        assert timed.comm.link == LINK and timed.train.epochs == 1


def test_the_full_plan_puts_every_format_at_every_place(tmp_path: Path) -> None:
    plan = runs(Settings(tmp_path, size="full"))
    assert Run("tensor", "-") in plan and Run("pipeline", "-") in plan
    for codec in FORMATS:
        for parallel, direction, ef in PLACES:
            assert Run(parallel, direction, codec, bool(ef)) in plan
    assert [t.key for t in tasks(Settings(tmp_path, size="full"))] == ["gpt-tiny", "mnist1d"]


def test_changes_pair_each_run_with_the_fp32_run_of_its_mode_and_seed() -> None:
    rows = [_row("tensor", "-", "fp32", 0.50, 0), _row("tensor", "-", "fp32", 0.70, 1),
            _row("pipeline", "-", "fp32", 0.40, 1),
            _row("tensor", "fwd", "bf16", 0.49, 0), _row("tensor", "fwd", "bf16", 0.70, 1),
            _row("pipeline", "fwd", "bf16", 0.38, 1)]
    fin = finals(rows)
    assert fin[("gpt-tiny", "tensor", "fwd", "bf16", 0)]["change"] == pytest.approx(-0.005)
    assert fin[("gpt-tiny", "pipeline", "fwd", "bf16", 0)]["change"] == pytest.approx(-0.02)


def test_bian_holds_when_half_the_forward_formats_lose_more_than_a_point() -> None:
    rows = [*_refs(), _row("tensor", "fwd", "bf16", 0.499), _row("tensor", "fwd", "table4", 0.45)]
    claim, ours, ok, why = bian(finals(rows), "gpt-tiny")
    assert ok is True and ours.startswith("1 of 2 lose more") and "within a point: bf16" in why
    rows.append(_row("tensor", "fwd", "fp8-e4m3", 0.50))
    _, _, ok, why = bian(finals(rows), "gpt-tiny")
    assert ok is False and why.startswith("within a point: ") and why.endswith(
        "; they cut the forward wire's bytes to their bits / 32 at no accuracy cost")


def test_gradients_and_error_feedback_verdicts_follow_the_numbers() -> None:
    rows = [*_refs(), _row("tensor", "fwd", "fp8-e5m2", 0.49), _row("tensor", "bwd", "fp8-e5m2", 0.40),
            _row("tensor", "fwd", "fp8-e5m2", 0.496, ef=1), _row("tensor", "bwd", "fp8-e5m2", 0.45, ef=1)]
    fin = finals(rows)
    _, ours, ok, why = gradients(fin, "gpt-tiny")
    assert ok is True and "backward -10.0 pts, forward -1.0 pts" in ours and "1 of 1" in why
    _, ours, ok, why = feedback(fin, "gpt-tiny")
    assert ok is False and "mean gain +2.8 pts over 2" in ours
    assert why == ("error feedback recovers what the formats lose; the largest gain: "
                   "fp8-e5m2 bwd +5.0 pts")
    assert gradients(finals(_refs()), "gpt-tiny")[2] is None  # no format ran: not measured


def test_within_a_layer_or_between_layers() -> None:
    rows = [*_refs(), _row("tensor", "fwd", "table4", 0.40), _row("pipeline", "fwd", "table4", 0.48)]
    assert layer_or_cut(finals(rows), "gpt-tiny")[2] is True
    rows[-1] = _row("pipeline", "fwd", "table4", 0.30)
    assert layer_or_cut(finals(rows), "gpt-tiny")[2] is False


def test_the_link_figure_needs_the_speed_up_and_the_accuracy() -> None:
    fin = finals([*_refs(), _row("tensor", "fwd", "bf16", 0.495),
                  _row("tensor", "fwd", "fp8-e4m3", 0.45)])
    fast = [_link("fp32", 0.20, 8e6), _link("bf16", 0.10, 4e6), _link("fp8-e4m3", 0.08, 3e6)]
    _, ours, ok, why = link_figure(fin, fast, "gpt-tiny")
    assert ok is True and "bf16: 2.00x, -0.5 pts" in ours and why.startswith("bf16 meet")
    slow = [_link("fp32", 0.20, 8e6), _link("bf16", 0.16, 6e6)]
    _, _, ok, why = link_figure(fin, slow, "gpt-tiny")
    assert ok is False and "cuts the bytes per step 1.33x" in why and "step 1.25x" in why
    lossy = [_link("fp32", 0.20, 8e6), _link("fp8-e4m3", 0.05, 3e6)]
    assert link_figure(fin, lossy, "gpt-tiny")[2] is False
    unrun = [_link("fp32", 0.20, 8e6), _link("fp16", 0.05, 4e6)]
    assert link_figure(fin, unrun, "gpt-tiny")[2] is None
    assert link_figure(fin, [], "gpt-tiny")[2] is None


def test_the_report_is_drawn_from_the_csvs_alone(tmp_path: Path) -> None:
    rows: Rows = []
    for task in ("gpt-tiny", "mnist1d"):
        rows += [{**r, "task": task} for r in _refs()]
        rows += [_row(p, d, c, 0.48, ef=e, task=task) for (p, d, e) in PLACES
                 for c in ("bf16", "table4")]
    write_csv(tmp_path / "accuracy.csv", ACCURACY_COLUMNS, rows)
    write_csv(tmp_path / "link.csv", LINK_COLUMNS,
              [_link("fp32", 0.2, 8e6), _link("bf16", 0.1, 4e6)])
    task = {"key": "k", "dataset": "d", "model": {"name": "m", "width": 4}, "split": "",
            "epochs": 2, "batch_size": 32, "lr": 0.1, "microbatches": 4, "schedule": "gpipe",
            "cut": "c", "why": "Why: test."}
    meta = {"experiment": "seed003-tp", "settings": {"out": str(tmp_path), "size": "quick"},
            "machine": {"cpus": 2, "torch": "x", "cuda": False, "load_avg_1min_at_start": 1.0},
            "command": "approxdist experiment seed003-tp --quick", "started": "now",
            "duration_s": 1.0, "tasks": {"gpt-tiny": task, "mnist1d": task}, "seeds": [0],
            "formats": ["fp32", "bf16", "table4"], "link": LINK, "tp": 2}
    (tmp_path / META_FILE).write_text(json.dumps(meta))
    text = render_report(tmp_path).read_text()
    assert "*Does Compressing Activations Help Model Parallel Training?*, MLSys 2024" in text
    assert "arXiv 2401.07788, 2024" in text and ("/" + "work/") not in text
    assert text.count("Rudakov et al. (2024): error feedback") == 2
    assert "| `bf16` | 8 | 48.0 % (n=1) (-2.0 pts) |" in text
    assert "bf16: 2.00x, -2.0 pts | **does not hold here**" in text
    assert (tmp_path / "accuracy_change.png").stat().st_size > 10_000
