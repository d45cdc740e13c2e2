"""`approxdist train --parallel pipeline`: outputs, per-stage checkpoints and resume, a dead stage,
and bad input through the CLI (exit 2, one line)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from approxdist.cli.main import main
from approxdist.config.loader import build_config, read_toml
from approxdist.config.pipeline import PipelineConfig
from approxdist.errors import LaunchError
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.models.mlp import mlp
from approxdist.pipeline.runtime import build_runtime
from approxdist.train.build import build_trainer
from approxdist.train.metrics import read_jsonl
from tests.helpers.runs import full_resumed_and_moved, rank_dies

FAST = ["--model", "mlp", "--set", "model.hidden=32", "--set", "train.progress=false"]

SECTIONS: dict[str, dict[str, Any]] = {
    "train": {"parallel": "pipeline", "world_size": 2, "progress": False, "seed": 3},
    "data": {"dataset": "synthetic", "synthetic_shape": [12], "synthetic_samples": 96,
             "batch_size": 16, "augment": False},
    "model": {"name": "mlp", "hidden": 32, "depth": 3, "dropout": 0.1},
    "optim": {"lr": 0.05, "schedule": "step", "step_size": 7, "gamma": 0.5},
    "pipeline": {"schedule": "1f1b", "microbatches": 3, "recompute": True},
}


def test_resume_from_stage_checkpoints_is_bit_exact(tmp_path: Path) -> None:
    """1 epoch, then a resume to 3, equals 3 straight, stage by stage; the saved run resumed
    from stage checkpoints whose weights were moved by 0.01 ends elsewhere in every weight
    of every stage (each stage reads its own file)."""
    ranks = run_on_ranks(full_resumed_and_moved, 2, SECTIONS, str(tmp_path))
    assert (tmp_path / "part" / "stage0" / "checkpoint.pt").is_file()
    assert (tmp_path / "part" / "stage1" / "checkpoint.pt").is_file()
    for stage, (full, resumed, moved) in enumerate(ranks):
        assert full.keys() == resumed.keys() == moved.keys()
        for name, ref in full.items():
            assert torch.equal(resumed[name], ref), (stage, name)
            assert not ref.is_floating_point() or not torch.equal(moved[name], ref), (stage, name)
    epochs = [r for r in read_jsonl(tmp_path / "part" / "metrics.jsonl") if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2, 3]


def test_cli_pipeline_run_writes_per_link_metrics_and_stage_checkpoints(tmp_path: Path) -> None:
    # planned with the model's options; `train --plan` alone trains what was planned
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", "mlp", "--set", "model.hidden=32", "--microbatch-size", "16",
                 "--world-size", "2", "--link", "bw=1gbit", "--stages", "2", "--microbatches",
                 "4", "--schedule", "1f1b", "--fwd-codec", "bits:s0e8m0", "--bwd-codec", "bf16",
                 "--repeat", "1", "--json", str(plan)]) == 0
    out = tmp_path / "run"
    assert main(["train", "--plan", str(plan), "--epochs", "2", "--out", str(out),
                 "--set", "train.progress=false"]) == 0
    config = build_config(read_toml(out / "config.toml"))
    assert (config.model.name, config.model.hidden, config.data.dataset) == ("mlp", 32, "digits")
    assert (config.data.batch_size, config.pipeline.microbatches) == (64, 4)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["stages"] == 2 and summary["parallel"] == "pipeline"
    assert summary["fwd_codec"] == "bits:s0e8m0" and summary["bytes_sent"] > 0
    assert summary["test_accuracy"] > 0.15  # above chance (0.1) after 2 short epochs
    assert {p.name for p in out.iterdir()} >= {"config.toml", "metrics.jsonl", "summary.json",
                                               "stage0", "stage1"}
    assert (out / "stage1" / "checkpoint.pt").is_file()
    epochs = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2]
    assert epochs[1]["train_loss"] < epochs[0]["train_loss"]
    record = epochs[-1]
    assert {"train_loss", "test_accuracy", "samples_per_s", "time_compute_s", "time_comm_s",
            "time_wait_s", "ranks"} <= set(record)
    sent = record["bytes_sent"]
    assert set(sent) == {"0->1", "1->0"} and sent["0->1"] * 1.8 < sent["1->0"]  # 8 vs 16 bits
    assert [(r["rank"], r["stage"]) for r in record["ranks"]] == [(0, 0), (1, 1)]


def _stage_dies(ctx: DistContext) -> None:
    torch.manual_seed(0)
    model = mlp((12,), 5, hidden=16, depth=3)
    x = torch.randn(16, 12)
    rt = build_runtime(PipelineConfig(stages=3, microbatches=4), model, ctx, x[:2])
    if ctx.rank == 2:
        os._exit(3)  # the last stage dies before its first forward
    for _ in range(3):
        rt.executor.train_step(x if ctx.rank == 0 else None, None, 16)


def test_dead_stage_stops_the_others_with_an_error_naming_it() -> None:
    with pytest.raises(LaunchError) as info:
        run_on_ranks(_stage_dies, 3, timeout_s=60, comm_timeout_s=10)
    text = str(info.value)
    assert "rank 2 failed" in text
    assert "stage 1 (rank 1) stopped at" in text and "from stage 2 (rank 2)" in text, text


@pytest.mark.parametrize(("args", "message"), [
    (["--split", "9"], "split index 9 out of range for a model of 4 blocks; valid boundaries "
                       "are 1..3"),
    (["--stages", "5"], "5 stages for a model of 4 blocks; use 1..4 stages"),
    (["--stages", "3", "--world-size", "2"], "places 3 rank(s) but the job has 2; start 3 "
                                             "workers (--world-size 3)"),
    (["--stages", "3", "--placement", "2,0,0"], "placement [2, 0, 0] must name every rank of a "
                                                "world of 3 (0..2) exactly once"),
    (["--stages", "3", "--placement", "0,1"], "pipeline.placement = [0, 1] names 2 rank(s) for 3 "
                                              "stage replica(s)"),
    (["--microbatches", "100", "--batch-size", "64"], "micro-batches (100) exceed the batch "
                                                      "size (64); use 1..64"),
    (["--fwd-codec", "bits:x"], "wire.fwd.codec = 'bits:x'"),
    (["--schedule", "zb"], "pipeline.schedule = 'zb' is not one of: 1f1b, gpipe"),
])
def test_bad_pipeline_input_is_one_line_exit_2(args: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--parallel", "pipeline", *args, *FAST]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def _placed(ctx: DistContext, root: str, placement: list[int]) -> dict[str, torch.Tensor]:
    sec = {k: dict(v) for k, v in SECTIONS.items()}
    sec["train"]["epochs"] = 2
    sec["pipeline"]["placement"] = placement
    trainer = build_trainer(build_config(sec), ctx, Path(root) / "-".join(map(str, placement)),
                            False)
    trainer.run()
    return {k: v.clone() for k, v in trainer.engine.module.state_dict().items()}


def _both_placements(ctx: DistContext, root: str) -> tuple[dict[str, torch.Tensor], ...]:
    return _placed(ctx, root, [0, 1]), _placed(ctx, root, [1, 0])


def test_placement_moves_stages_without_changing_the_numbers(tmp_path: Path) -> None:
    """Stage 0 on rank 1 and stage 1 on rank 0 train bitwise as the default placement
    (dropout included: per-rank seeds follow the place in the topology, not the rank)."""
    ranks = run_on_ranks(_both_placements, 2, str(tmp_path))
    for stage in (0, 1):
        default, swapped = ranks[stage][0], ranks[1 - stage][1]
        assert default.keys() == swapped.keys()
        for name, ref in default.items():
            assert torch.equal(swapped[name], ref), (stage, name)
    assert (tmp_path / "1-0" / "stage0" / "checkpoint.pt").is_file()
    record = [r for r in read_jsonl(tmp_path / "1-0" / "metrics.jsonl") if r["kind"] == "epoch"][-1]
    assert [(r["rank"], r["stage"]) for r in record["ranks"]] == [(0, 1), (1, 0)]
    assert set(record["bytes_sent"]) == {"0->1", "1->0"}


def test_a_dead_rank_is_named_with_its_place_in_the_topology(tmp_path: Path) -> None:
    sec = {k: dict(v) for k, v in SECTIONS.items()}
    sec["train"]["world_size"] = 3
    sec["pipeline"] = {**sec["pipeline"], "stages": 3, "placement": [2, 0, 1]}
    with pytest.raises(LaunchError) as info:  # rank 1 holds stage 2
        run_on_ranks(rank_dies, 3, sec, str(tmp_path), 1, timeout_s=90, comm_timeout_s=10)
    text = str(info.value)
    assert "rank 1 failed" in text
    assert "lost rank 1 (stage 2, replica 0), which may have died; rank 0 (stage 1, replica 0) " \
           "stopped" in text, text
