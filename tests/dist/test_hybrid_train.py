"""`approxdist train --parallel hybrid`: resume, per-link metrics and checkpoints, a dead
replica, and bad input through the CLI (exit 2, one line)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from approxdist.cli.main import main
from approxdist.config.loader import build_config
from approxdist.errors import LaunchError
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.trace import open_recorder, read_trace
from approxdist.train.metrics import read_jsonl, write_summary
from approxdist.train.worker import train_traced
from tests.helpers.runs import full_and_resumed, rank_dies

FAST = ["--model", "mlp", "--set", "model.hidden=32", "--set", "train.progress=false"]

SECTIONS: dict[str, dict[str, Any]] = {
    "train": {"parallel": "hybrid", "world_size": 4, "progress": False, "seed": 3},
    "data": {"dataset": "synthetic", "synthetic_shape": [12], "synthetic_samples": 96,
             "batch_size": 16, "augment": False},
    "model": {"name": "mlp", "hidden": 32, "depth": 3, "dropout": 0.1},
    "optim": {"lr": 0.05, "schedule": "step", "step_size": 7, "gamma": 0.5},
    "pipeline": {"stages": 2, "replicas": [3, 1], "schedule": "1f1b", "microbatches": 4},
    "wire": {"grad": {"codec": "bf16", "error_feedback": True}},
}


def test_resume_of_a_replicated_run_is_bit_exact(tmp_path: Path) -> None:
    """3 + 1 replicas, lossy all-reduce with error feedback (residuals travel in the stage's
    checkpoint), dropout: resumed equals uninterrupted, bit for bit, on every rank."""
    ranks = run_on_ranks(full_and_resumed, 4, SECTIONS, str(tmp_path), timeout_s=180)
    for rank, (full, resumed) in enumerate(ranks):
        for name, ref in full.items():
            assert torch.equal(resumed[name], ref), (rank, name)
    for rank in (1, 2):  # replicas of stage 0 hold what replica 0 holds
        for name, ref in ranks[0][0].items():
            assert torch.equal(ranks[rank][0][name], ref), (rank, name)
    ckpt = torch.load(tmp_path / "part" / "stage0" / "checkpoint.pt", weights_only=True)
    assert len(ckpt["dp"]["ranks"]) == 3 and all(r["residuals"] for r in ckpt["dp"]["ranks"])
    epochs = [r for r in read_jsonl(tmp_path / "part" / "metrics.jsonl") if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2, 3]


def _traced_run(ctx: DistContext, out: str) -> dict[str, Any]:
    """What `approxdist train --parallel hybrid --stages 2 --replicas 2 --trace` runs on
    each rank (the CLI's own launch is tested for pipelines; this saves 4 spawns)."""
    sections = {k: dict(v) for k, v in SECTIONS.items()}
    sections["train"].update(epochs=2, trace=True, seed=0)
    sections["model"]["dropout"] = 0.0
    sections["data"] = {"dataset": "digits", "batch_size": 64}
    sections["pipeline"] = {"stages": 2, "replicas": [2], "microbatches": 4,
                            "schedule": "gpipe", "split": "2"}
    sections["dp"] = {}
    cfg = build_config(sections)
    rec = open_recorder(ctx, True, label=f"stage {ctx.rank // 2}")
    return train_traced(cfg, ctx, Path(out), False, rec)


def test_hybrid_run_writes_per_link_metrics_stage_checkpoints_and_a_trace(tmp_path: Path) -> None:
    out = tmp_path / "run"
    summary = run_on_ranks(_traced_run, 4, str(out), timeout_s=180)[0]
    write_summary(out, summary)
    trace = read_trace(out / "trace.json")
    spans = {(e["pid"], e["name"]) for e in trace["traceEvents"] if e["ph"] == "X"}
    for rank, phases in ((0, ("run_for", "send_for", "receive_back", "run_back", "sync")),
                         (1, ("run_for", "send_for", "receive_back", "run_back", "sync")),
                         (2, ("receive_for", "run_for", "run_back", "send_back", "sync")),
                         (3, ("receive_for", "run_for", "run_back", "send_back", "sync"))):
        assert {(rank, p) for p in phases} <= spans, (rank, sorted(p for r, p in spans if r == rank))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["parallel"] == "hybrid" and summary["replicas"] == [2, 2]
    assert summary["mesh"] == {"spec": "pp=2,dp=2", "ranks": [0, 1, 2, 3]}
    assert summary["world_size"] == 4 and summary["test_accuracy"] > 0.15  # 10 classes: chance 0.1
    assert (out / "stage0" / "checkpoint.pt").is_file() and (out / "stage1" / "checkpoint.pt").is_file()
    epochs = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "epoch"]
    assert epochs[1]["train_loss"] < epochs[0]["train_loss"]
    record = epochs[-1]
    assert [(r["rank"], r["stage"], r["replica"]) for r in record["ranks"]] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    sent = record["bytes_sent"]
    # rows: micro-batches 0, 2 on ranks 0 -> 2, 1, 3 on ranks 1 -> 3; replicas sum gradients
    assert set(sent) == {"0->2", "2->0", "1->3", "3->1", "0->1", "1->0", "2->3", "3->2"}
    assert sent["0->2"] == sent["1->3"] and sent["0->1"] == sent["1->0"] > 0


def test_a_dead_replica_is_named_with_its_stage(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as info:  # rank 1 is replica 1 of stage 0
        run_on_ranks(rank_dies, 4, SECTIONS, str(tmp_path), 1, timeout_s=90, comm_timeout_s=10)
    text = str(info.value)
    assert "rank 1 failed" in text
    assert "lost rank 1 (stage 0, replica 1), which may have died" in text, text


@pytest.mark.parametrize(("args", "message"), [
    (["--stages", "2", "--replicas", "3,1", "--world-size", "3"],
     "places 4 rank(s) but the job has 3; start 4 workers (--world-size 4)"),
    (["--stages", "2", "--replicas", "2,0"], "pipeline.replicas = [2, 0] must be one count >= 1"),
    (["--stages", "3", "--replicas", "2,1"], "pipeline.replicas = [2, 1] must be one count"),
    (["--stages", "2", "--replicas", "3,1", "--microbatches", "2"],
     "micro-batches (2) must be at least the largest replica count (3)"),
    (["--stages", "2", "--replicas", "2", "--microbatches", "80", "--batch-size", "64"],
     "micro-batches (80) exceed the batch size (64)"),
    (["--stages", "9", "--replicas", "1"], "9 stages for a model of 4 blocks"),
    (["--stages", "2", "--replicas", "2", "--dp-reducer", "plain"], "drop --dp-reducer plain"),
    (["--stages", "2", "--replicas", "x"], "--replicas 'x' is not a comma-separated list"),
])
def test_bad_hybrid_input_is_one_line_exit_2(args: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--parallel", "hybrid", *args, *FAST]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
