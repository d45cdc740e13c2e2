"""N+b through the trainer: a persistent straggler skips the steps taken without it.

One set of 4 gloo processes trains two runs of 2 epochs with a 100 ms straggler (1 server
+ 3 workers, and 2 servers + 2 workers): every server update uses exactly N gradients,
the straggler pushes fewer gradients than the other workers and its skipped steps are
counted, and the run ends cleanly (no push left unreceived between the epochs). The
1 + 3 run's server ends with the parameters of a one-process replay of the push order its
metrics.jsonl recorded, at the learning rate each step recorded (1e-5).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F  # noqa: N812

from approxdist.config.loader import build_config
from approxdist.data import ShardedBatches, load_dataset
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.models import build_model
from approxdist.train.build import build_trainer
from tests.helpers.ps_replay import Setup, pushes_of, replay

EPOCHS, BATCH = 2, 60
RUNS = {"1+3": (1, 3), "2+2": (2, 2)}


def _sections(servers: int, workers: int) -> dict[str, dict[str, Any]]:
    return {"train": {"parallel": "ps", "world_size": 4, "epochs": EPOCHS, "log_every": 1,
                      "progress": False, "stragglers": ["3:100ms"]},
            "model": {"name": "mlp", "hidden": 16},
            "data": {"batch_size": BATCH, "augment": False},
            "ps": {"servers": servers, "workers": workers, "mode": "backup:1"}}


def _train_runs(ctx: DistContext, root: str) -> dict[str, dict[str, Any]]:
    out = {}
    for name, (servers, workers) in RUNS.items():
        trainer = build_trainer(build_config(_sections(servers, workers)), ctx,
                                Path(root) / name, False)
        out[name] = {"summary": trainer.run(), "params": {
            n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()}}
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
    summary = ranks[0][name]["summary"]
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



def test_the_trainers_run_equals_the_replayed_push_order(
        runs: tuple[Path, list[dict[str, Any]]]) -> None:
    """The 1 + 3 run's server (two epochs, the trainer's cosine rate, the straggler) holds
    the parameters of the replay of the push order its metrics.jsonl recorded: each update
    at its step's recorded rate, each gradient on its worker's batch of the step it read."""
    root, ranks = runs
    cfg = build_config(_sections(1, 3))
    data = load_dataset(cfg.data)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes)

    def share(worker: int, step: int, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        batches = ShardedBatches(data, BATCH, worker, 3, cfg.train.seed, False)
        return next(batches.epoch(epoch, step))

    lines = (root / "1+3" / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r["kind"] == "step"]
    pushes = pushes_of(records)
    assert {p.epoch for p in pushes} == {0, 1} and len({p.lr for p in pushes}) > 2
    setup = Setup("backup", 3, cfg.optim.lr, cfg.optim.momentum, cfg.optim.weight_decay)
    want = replay(model, share, F.cross_entropy, pushes, setup)
    server = ranks[0]["1+3"]["params"]
    for name, p in want.items():
        torch.testing.assert_close(server[name], p, atol=1e-5, rtol=0, msg=name)
