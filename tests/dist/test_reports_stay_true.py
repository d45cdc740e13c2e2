"""A preset's report on a task other than its default states this run's numbers, not the
default task's: seed000-bandwidth at smoke size on synthetic data with a wider cut, its
explanation checked against its own CSV (bytes per sample at the cut, the link rate below
which the link dominates), and none of the default task's figures in the text. And
seed003-largebatch's verdicts and reasons, rendered from a hand-made CSV (no runs), follow
what that CSV holds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from approxdist.experiments import Settings, run_experiment
from approxdist.experiments import largebatch_report as rep
from approxdist.experiments import seed000_bandwidth as bw
from approxdist.experiments.base import Settings as BaseSettings
from approxdist.experiments.csvio import read_csv, write_csv
from approxdist.experiments.runner import META_FILE, render_report
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


# -- seed003-largebatch: the verdicts and their reasons follow the CSV ------------------------
N_TRAIN, MOMENTUM = 4000, 0.9


def _run_rows(rule: str, batch: int, accs: list[float], losses: list[float],
              batches: list[int] | None = None, lrs: list[float] | None = None,
              train_gap: float = 0.0) -> list[dict[str, object]]:
    """One run's CSV rows, consistent with each other (updates, samples, noise scale)."""
    rows, updates, samples = [], 0, 0
    for e, (acc, loss) in enumerate(zip(accs, losses)):
        b = (batches or [batch] * len(accs))[e]
        lr = (lrs or [0.05] * len(accs))[e]
        updates += N_TRAIN // b
        samples += N_TRAIN // b * b
        rows.append({"rule": rule, "global_batch": batch, "seed": 0, "epoch": e + 1,
                     "train_accuracy": acc + train_gap, "test_accuracy": acc, "train_loss": loss,
                     "test_loss": loss, "epoch_time_s": 1.0, "bytes_fwd": 0, "batch_size": b,
                     "lr": lr, "noise_scale": lr / (1 - MOMENTUM) * (N_TRAIN / b - 1),
                     "updates": updates, "samples_seen": samples, "elapsed_s": float(e + 1)})
    return rows


def _largebatch_report(out: Path, scaled_512_losses: list[float], train_gap: float = 0.0) -> str:
    falling = [1.5, 1.0, 0.8]
    rows = (_run_rows(rep.UNSCALED, 32, [0.6, 0.8, 0.9], falling)
            + _run_rows(rep.SCALED, 32, [0.6, 0.8, 0.9], falling)
            + _run_rows(rep.UNSCALED, 128, [0.3, 0.5, 0.7], falling)
            + _run_rows(rep.SCALED, 128, [0.5, 0.8, 0.86], falling)
            + _run_rows(rep.UNSCALED, 512, [0.2, 0.3, 0.4], falling)
            + _run_rows(rep.SCALED, 512, [0.3, 0.2, 0.45], scaled_512_losses,
                        train_gap=train_gap)
            + _run_rows(rep.DECAY, 32, [0.6, 0.8, 0.9], falling, lrs=[0.05, 0.01, 0.002])
            + _run_rows(rep.GROWTH, 32, [0.6, 0.75, 0.8], falling, batches=[32, 160, 800]))
    write_csv(out / "largebatch.csv", rep.COLUMNS, rows)
    meta = {"experiment": "seed003-largebatch", "command": "test", "started": "now",
            "duration_s": 1.0, "settings": {"out": str(out), "size": "quick"},
            "machine": {"cpus": 2, "torch": "x", "cuda": False, "load_avg_1min_at_start": 0.0},
            "seeds": [0], "ranks": 2, "cores": 2, "dataset": "mnist1d", "model": {},
            "epochs": 3, "lr": 0.05, "base_batch": 32, "warmup_epochs": 1.0,
            "momentum": MOMENTUM, "gamma": 0.2, "every": 1, "train_size": N_TRAIN,
            "test_size": 1000, "batch_norm": True}
    (out / META_FILE).write_text(json.dumps(meta))
    return render_report(out).read_text()


def _trend(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {start}"))


def test_the_largebatch_report_states_what_its_csv_holds(tmp_path: Path) -> None:
    unstable = _largebatch_report(tmp_path, [2.0, 1.0, 1.6])
    falls = _trend(unstable, "without scaling rules")
    assert "90.0 % (32) → 70.0 % (128) → 40.0 % (512)" in falls and "| holds |" in falls
    assert "-50.0 pts" in falls and "B = 512 makes 21 updates in the run against 375" in falls
    back = _trend(unstable, "B = 128 (4x)")
    assert "80 % of the loss back" in back and "| holds |" in back and "peak rate 0.2" in back
    lost = _trend(unstable, "B = 512 (16x)")
    assert "10 % of the loss back" in lost and "does not hold here" in lost
    assert "training loss rose at epoch 3 (1.000 → 1.600)" in lost and "peak rate 0.8" in lost
    assert "12.8 % of the training set" in lost  # 512 / 4000
    growth = _trend(unstable, "growing the batch instead")
    assert "80.0 % vs 90.0 % (decay)" in growth and "does not hold here" in growth
    assert "155 vs 375 updates (0.41x)" in growth  # 125 + 25 + 5 against 3 x 125
    assert "32 → 160 → 800" in growth and "0.05 → 0.01 → 0.002" in growth
    noise = _trend(unstable, "growing B by the factor")
    assert "1.00, 0.97, 0.81" in noise  # (N/160 - 1) / (5 (N/32 - 1)) etc., from the rows

    slow = _largebatch_report(tmp_path, [2.0, 1.7, 1.6])  # falls every epoch: too few updates
    lost = _trend(slow, "B = 512 (16x)")
    assert "rose" not in lost and "fell every epoch but ended at 1.600" in lost

    lagging = _largebatch_report(tmp_path, [2.0, 1.7, 1.6], train_gap=0.3)  # 75 % train, 45 % test
    lost = _trend(lagging, "B = 512 (16x)")
    assert "training accuracy 75.0 % against 45.0 % on the test set (+30.0 pts" in lost
    assert "BatchNorm's running statistics" in lost and "after 21 updates at rates up to 0.05" in lost
    assert "the rule brings back 70 % of the loss (75.0 % vs 40.0 % unscaled" in lost
