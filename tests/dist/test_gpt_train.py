"""A transformer trained by `approxdist train`'s trainer on token data: single process,
data-parallel (2 ranks) and a 2-stage pipeline report the same per-token losses and
accuracies at every epoch (fp32), through the next-token task's counting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from tests.helpers.runs import train

KEYS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy")


def _sections(data: str, parallel: str, world: int, out: str) -> dict[str, dict[str, Any]]:
    sec: dict[str, dict[str, Any]] = {
        "train": {"parallel": parallel, "world_size": world, "progress": False, "out": out},
        "data": {"dataset": "npz", "data_dir": data, "batch_size": 8, "test_batch_size": 8},
        "model": {"name": "tests.helpers.user_models:tiny_gpt"},
        "optim": {"lr": 0.3}}
    if parallel == "pipeline":
        sec["pipeline"] = {"stages": 2, "microbatches": 2}
    return sec


def _runs(ctx: DistContext, data: str, root: str, modes: list[str]) -> None:
    for mode in modes:
        world = 1 if mode == "single" else 2
        run_dir = Path(root) / mode
        train(ctx, _sections(data, mode, world, str(run_dir)), run_dir, 2)


def _epochs(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "epoch"]


def test_gpt_losses_agree_across_modes(tmp_path: Path) -> None:
    gen = np.random.default_rng(0)
    ids = gen.integers(0, 12, (60, 9)) % (np.arange(9) + 3)  # learnable, position-dependent
    data = str(tmp_path / "tokens.npz")
    np.savez(data, x_train=ids[:48, :-1], y_train=ids[:48, 1:], x_test=ids[48:, :-1],
             y_test=ids[48:, 1:])
    run_on_ranks(_runs, 1, data, str(tmp_path), ["single"], timeout_s=120)
    run_on_ranks(_runs, 2, data, str(tmp_path), ["dp", "pipeline"], timeout_s=120)
    single = _epochs(tmp_path / "single")
    assert len(single) == 2 and single[1]["train_loss"] < single[0]["train_loss"]
    for mode in ("dp", "pipeline"):
        for ref, got in zip(single, _epochs(tmp_path / mode), strict=True):
            for key in KEYS:
                assert got[key] >= 0 and (key.endswith("loss") or got[key] <= 1), (mode, key)
                assert got[key] == pytest.approx(ref[key], abs=1e-5), (mode, key)
