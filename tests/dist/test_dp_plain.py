"""Plain data parallelism vs the single-process oracle, and bit-exact resume (single and dp)
that trains only the epochs left (`tests/helpers/runs.py`), from the weights it was given."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from approxdist.config.loader import build_config
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.train.build import build_trainer
from tests.helpers.runs import full_and_resumed, full_resumed_and_moved, move_weights

SECTIONS: dict[str, dict[str, Any]] = {
    "train": {"epochs": 2, "progress": False, "seed": 3},
    "data": {"dataset": "synthetic", "synthetic_shape": [12], "synthetic_samples": 96,
             "batch_size": 16, "augment": False},
    "model": {"name": "mlp", "hidden": 32, "depth": 2},
    "optim": {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3, "schedule": "step",
              "step_size": 7, "gamma": 0.5},
}


def _cfg(world: int, epochs: int) -> Any:
    sec = {k: dict(v) for k, v in SECTIONS.items()}
    sec["train"].update(world_size=world, epochs=epochs, parallel="dp" if world > 1 else "single")
    return build_config(sec)


def _train(ctx: DistContext, run_dir: str, epochs: int, resume: bool) -> dict[str, torch.Tensor]:
    trainer = build_trainer(_cfg(ctx.world_size, epochs), ctx, Path(run_dir), resume)
    trainer.run()
    return {k: v.clone() for k, v in trainer.engine.module.state_dict().items()}


def test_dp_matches_single_process_on_combined_batch(tmp_path: Path) -> None:
    single = _train(DistContext(), str(tmp_path / "single"), 2, False)
    ranks = run_on_ranks(_train, 2, str(tmp_path / "dp"), 2, False)
    for name, ref in single.items():
        torch.testing.assert_close(ranks[0][name], ref, atol=1e-5, rtol=0)
        assert torch.equal(ranks[0][name], ranks[1][name]), f"replicas differ at {name}"
    assert (tmp_path / "dp" / "checkpoint.pt").is_file()


def _sections(world: int) -> dict[str, dict[str, Any]]:
    sec = {k: dict(v) for k, v in SECTIONS.items()}
    sec["train"].update(world_size=world, parallel="dp" if world > 1 else "single")
    return sec


def _differs_everywhere(moved: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> bool:
    return moved.keys() == ref.keys() and all(
        not torch.equal(moved[k], ref[k]) for k in ref if ref[k].is_floating_point())


def test_resume_is_bit_exact_single(tmp_path: Path) -> None:
    """1 epoch, then a resume to 3 that trains epochs 2 and 3 only, equals 3 straight."""
    full, resumed = full_and_resumed(DistContext(), _sections(1), str(tmp_path))
    for name, ref in full.items():
        assert torch.equal(resumed[name], ref), name


def test_resume_is_bit_exact_dp(tmp_path: Path) -> None:
    """As single, on 2 ranks; and the saved run resumed from a checkpoint whose weights were
    moved by 0.01 ends elsewhere on both replicas, which still agree bitwise (rank 0 read
    the moved weights and handed them to rank 1)."""
    ranks = run_on_ranks(full_resumed_and_moved, 2, _sections(2), str(tmp_path))
    for full, resumed, moved in ranks:
        for name, ref in ranks[0][0].items():
            assert torch.equal(full[name], ref), name
            assert torch.equal(resumed[name], ref), name
            assert torch.equal(moved[name], ranks[0][2][name]), name
        assert _differs_everywhere(moved, resumed)


def test_a_resume_starts_from_the_saved_weights(tmp_path: Path) -> None:
    """The same saved run resumed twice, once with its checkpoint's weights moved by 0.01:
    the two resumed runs differ, so a resume reads the weights it was given (the checks
    above: from the saved epoch on, nothing retrained)."""
    ctx = DistContext()
    _train(ctx, str(tmp_path / "saved"), 1, False)
    shutil.copytree(tmp_path / "saved", tmp_path / "moved")
    move_weights(tmp_path / "moved")
    saved = _train(ctx, str(tmp_path / "saved"), 2, True)
    moved = _train(ctx, str(tmp_path / "moved"), 2, True)
    assert _differs_everywhere(moved, saved)
