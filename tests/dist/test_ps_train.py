"""N+b through the trainer: a persistent straggler skips the steps taken without it.

One set of 4 gloo processes trains two runs of 2 epochs with a 100 ms straggler (1 server
+ 3 workers, and 2 servers + 2 workers): every server update uses exactly N gradients,
the straggler pushes fewer gradients than the other workers and its skipped steps are
counted, and the run ends cleanly (no push left unreceived between the epochs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from approxdist.config.loader import build_config
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.train.build import build_trainer

EPOCHS, BATCH = 2, 60
RUNS = {"1+3": (1, 3), "2+2": (2, 2)}


def _sections(servers: int, workers: int) -> dict[str, dict[str, Any]]:
    return {"train": {"parallel": "ps", "world_size": 4, "epochs": EPOCHS, "log_every": 1,
                      "progress": False, "stragglers": ["3:100ms"]},
            "model": {"name": "mlp", "hidden": 16},
            "data": {"batch_size": BATCH},
            "ps": {"servers": servers, "workers": workers, "mode": "backup:1"}}


def _train_runs(ctx: DistContext, root: str) -> dict[str, dict[str, Any]]:
    out = {}
    for name, (servers, workers) in RUNS.items():
        trainer = build_trainer(build_config(_sections(servers, workers)), ctx,
                                Path(root) / name, False)
        out[name] = trainer.run()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("ps_backup")
    return root, run_on_ranks(_train_runs, 4, str(root), timeout_s=180)


@pytest.mark.parametrize("name", list(RUNS))
def test_backup_straggler_skips_ahead_and_updates_use_n(
        runs: tuple[Path, list[dict[str, Any]]], name: str) -> None:
    root, ranks = runs
    servers, workers = RUNS[name]
    summary = ranks[0][name]
    steps = summary["steps"]
    ps = summary["ps"]
    lines = (root / name / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r["kind"] == "step"]
    assert summary["epochs"] == EPOCHS and len(records) == steps == ps["updates"]
    assert all(len(r["applied_from"]) == workers - 1 for r in records)  # N = W - b
    straggler = workers - 1  # global rank 3
    assert ps["pushes"][straggler] < min(ps["pushes"][:straggler]) <= steps
    skipped = summary["skipped_steps"]
    assert skipped[:servers] == [0] * servers and skipped[3] > 0
    if servers == 1:  # server 0 saw every push of the straggler
        assert skipped[3] == steps - ps["pushes"][straggler]
    epochs = [r for r in map(json.loads, lines) if r["kind"] == "epoch"]
    assert sum(r["ranks"][3]["skipped_steps"] for r in epochs) == skipped[3]

