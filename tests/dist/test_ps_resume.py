"""A parameter-server run resumed from its checkpoint continues as if never stopped, with
error feedback on the pushes (the workers' residuals travel in the checkpoint): it trains
only the epochs left, and its weights and residuals equal the uninterrupted run's bit for
bit (a sync server reads the pushes in worker order, so nothing depends on timing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from approxdist.launch.spawn import run_on_ranks
from tests.helpers.runs import full_and_resumed

SECTIONS: dict[str, dict[str, Any]] = {
    "train": {"parallel": "ps", "world_size": 3, "progress": False, "seed": 5},
    "data": {"dataset": "synthetic", "synthetic_shape": [12], "synthetic_samples": 96,
             "batch_size": 16, "augment": False},
    "model": {"name": "mlp", "hidden": 32, "depth": 2},
    "optim": {"lr": 0.05, "schedule": "step", "step_size": 5, "gamma": 0.5},
    "ps": {"servers": 1, "workers": 2, "mode": "sync"},
    "wire": {"push": {"codec": "bf16", "error_feedback": True}},
}


def test_resumed_ps_run_with_error_feedback_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    ranks = run_on_ranks(full_and_resumed, 3, SECTIONS, str(tmp_path), timeout_s=180)
    for rank, (full, resumed) in enumerate(ranks):
        for name, ref in full.items():
            assert torch.equal(resumed[name], ref), (rank, name)
    saved = {name: torch.load(tmp_path / name / "checkpoint.pt", weights_only=True)
             for name in ("full", "part")}
    assert set(saved["part"]["feedback"]) == {"0", "1"}  # one entry per worker
    for worker, shards in saved["full"]["feedback"].items():
        for shard, residuals in shards.items():
            for name, ref in residuals.items():
                assert ref.abs().max() > 0, (worker, name)  # bf16 leaves a residual
                got = saved["part"]["feedback"][worker][shard][name]
                assert torch.equal(got, ref), (worker, name)
