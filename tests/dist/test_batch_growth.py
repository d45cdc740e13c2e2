"""A growing batch (optim.schedule = "grow", Smith et al. 2018) through the one trainer on 2
data-parallel ranks: the epochs' batches and noise scales, and a bit-exact resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from approxdist.launch.spawn import run_on_ranks
from approxdist.train.metrics import read_jsonl
from tests.helpers.runs import full_and_resumed

SECTIONS: dict[str, dict[str, Any]] = {
    "train": {"parallel": "dp", "world_size": 2, "progress": False, "seed": 3},
    "data": {"dataset": "synthetic", "synthetic_shape": [12], "synthetic_samples": 192,
             "batch_size": 16, "augment": False},
    "model": {"name": "mlp", "hidden": 32, "depth": 2},
    "optim": {"lr": 0.05, "momentum": 0.9, "schedule": "grow", "grow_every_epochs": 1,
              "gamma": 0.5, "max_batch": 32},
}


def test_the_batch_grows_then_the_rate_decays_and_resume_is_exact(tmp_path: Path) -> None:
    ranks = run_on_ranks(full_and_resumed, 2, SECTIONS, str(tmp_path))
    for full, resumed in ranks:
        for name, ref in full.items():
            assert torch.equal(resumed[name], ref), name
    epochs = [r for r in read_jsonl(tmp_path / "full" / "metrics.jsonl") if r["kind"] == "epoch"]
    assert [r["batch_size"] for r in epochs] == [16, 32, 32]  # capped at max_batch = 32
    assert [r["step"] for r in epochs] == [12, 18, 24]        # 192 / 16, then 192 / 32
    assert [r["lr"] for r in epochs] == pytest.approx([0.05, 0.05, 0.025])
    g = [r["noise_scale"] for r in epochs]
    assert g == pytest.approx([0.05 / 0.1 * (192 / 16 - 1), 0.05 / 0.1 * (192 / 32 - 1),
                               0.025 / 0.1 * (192 / 32 - 1)])
