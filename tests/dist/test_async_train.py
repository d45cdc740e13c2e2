"""`train --schedule 2bw|pipedream` through the one trainer: bit-exact resume at epoch ends
(where the stream has drained), step records naming the weight versions of their loss,
the versions' memory per stage, and the summary's keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.pipeline.schedule.registry import build_async_schedule
from approxdist.train.metrics import read_jsonl
from tests.helpers.runs import State, full_and_resumed

SCHEDULES = ("2bw", "pipedream")
SECTIONS: dict[str, dict[str, Any]] = {
    "train": {"parallel": "pipeline", "world_size": 2, "progress": False, "seed": 3,
              "log_every": 1},
    "data": {"dataset": "synthetic", "synthetic_shape": [12], "synthetic_samples": 96,
             "batch_size": 16, "augment": False},
    "model": {"name": "mlp", "hidden": 32, "depth": 3, "dropout": 0.1},
    "optim": {"lr": 0.05, "schedule": "step", "step_size": 7, "gamma": 0.5},
    "pipeline": {"microbatches": 2, "recompute": True},
}


def _both(ctx: DistContext, root: str) -> dict[str, tuple[State, State]]:
    out = {}
    for name in SCHEDULES:
        sections = {**SECTIONS, "pipeline": {**SECTIONS["pipeline"], "schedule": name}}
        out[name] = full_and_resumed(ctx, sections, str(Path(root) / name))
    return out


def test_async_runs_resume_bit_exact_and_log_their_weight_versions(tmp_path: Path) -> None:
    ranks = run_on_ranks(_both, 2, str(tmp_path), timeout_s=240)
    steps_per_epoch = 96 // 16
    for name in SCHEDULES:
        for stage, rank in enumerate(ranks):
            full, resumed = rank[name]
            for key, ref in full.items():
                assert torch.equal(resumed[key], ref), (name, stage, key)
        records = read_jsonl(tmp_path / name / "full" / "metrics.jsonl")
        steps = [r for r in records if r["kind"] == "step"]
        epochs = [r for r in records if r["kind"] == "epoch"]
        assert len(steps) == 3 * steps_per_epoch and len(epochs) == 3
        sched = build_async_schedule(name, 2, 2, steps_per_epoch)
        for r in steps:
            versions = r["weight_versions"]
            assert len(versions) == 2 and all(lo <= hi for lo, hi in versions)
            # a version is counted within the epoch's stream: at most its optimizer steps
            assert all(lo >= 0 and hi <= len(sched.updates[s])
                       for s, (lo, hi) in enumerate(versions) if lo >= 0)
        if name == "2bw":  # mini-batch b's loss comes from version max(b - 1, 0) everywhere
            assert [r["weight_versions"][1] for r in steps[:steps_per_epoch] if r["loss"]] == \
                [[max(b - 1, 0), max(b - 1, 0)] for b in range(steps_per_epoch)]
        for e in epochs:  # pipedream's last stage keeps no version past a step: in place
            peaks = [row["peak_weight_version_bytes"] for row in e["ranks"]]
            assert peaks[0] > 0 and (peaks[-1] == 0) == (name == "pipedream"), (name, peaks)
            assert e["train_loss"] > 0


HYBRID: dict[str, dict[str, Any]] = {
    **SECTIONS, "train": {**SECTIONS["train"], "parallel": "hybrid", "world_size": 3},
    "pipeline": {**SECTIONS["pipeline"], "stages": 2, "replicas": [2, 1]},
}


def _hybrid(ctx: DistContext, root: str) -> dict[str, tuple[State, State]]:
    out = {}
    for name in SCHEDULES:
        sections = {**HYBRID, "pipeline": {**HYBRID["pipeline"], "schedule": name}}
        out[name] = full_and_resumed(ctx, sections, str(Path(root) / name))
    return out


def test_async_runs_on_replicated_stages_resume_bit_exact(tmp_path: Path) -> None:
    """Stage 0 on two ranks, stage 1 on one: the replicas end every epoch identical, a
    resumed run equals the straight one bit for bit, and 2bw's step records still name
    version max(b - 1, 0) for mini-batch b."""
    ranks = run_on_ranks(_hybrid, 3, str(tmp_path), timeout_s=240)
    steps_per_epoch = 96 // 16
    for name in SCHEDULES:
        for rank in ranks:
            full, resumed = rank[name]
            for key, ref in full.items():
                assert torch.equal(resumed[key], ref), (name, key)
        replica0, replica1 = ranks[0][name][0], ranks[1][name][0]
        assert all(torch.equal(replica0[k], replica1[k]) for k in replica0), name
        steps = [r for r in read_jsonl(tmp_path / name / "full" / "metrics.jsonl")
                 if r["kind"] == "step"]
        assert len(steps) == 3 * steps_per_epoch
        if name == "2bw":
            assert [r["weight_versions"][0] for r in steps[:steps_per_epoch] if r["loss"]] == \
                [[max(b - 1, 0), max(b - 1, 0)] for b in range(steps_per_epoch)]
