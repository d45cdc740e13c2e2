"""`approxdist plan --mesh tp=2` writes a tensor plan that `approxdist train --plan` runs:
tensor parallelism with the planned tp size, plan and tp wire, on what was planned for."""

from __future__ import annotations

import json
from pathlib import Path

from approxdist.cli.main import main
from approxdist.config.loader import build_config, read_toml


def test_a_tensor_plan_trains_as_planned(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", "mlp", "--set", "model.hidden=32", "--microbatch-size", "16",
                 "--mesh", "tp=2", "--link", "bw=1gbit", "--fwd-codec", "bf16", "--repeat", "1",
                 "--json", str(plan)]) == 0
    assert json.loads(plan.read_text())["mode"] == "tensor"
    out = tmp_path / "run"
    assert main(["train", "--plan", str(plan), "--epochs", "1", "--out", str(out),
                 "--set", "train.progress=false"]) == 0
    config = build_config(read_toml(out / "config.toml"))
    assert (config.model.name, config.model.hidden, config.data.dataset) == ("mlp", 32, "digits")
    assert (config.train.parallel, config.train.world_size, config.tp.size) == ("tensor", 2, 2)
    assert config.tp.plan == "0.1=colwise,1.0=rowwise,2.0=colwise,3.0=rowwise"
    assert config.wire.wire("tp_fwd").codec == "bf16" and config.wire.wire("tp_bwd").codec == "fp32"
    assert config.data.batch_size == 16  # one micro-batch for the one replica
    summary = json.loads((out / "summary.json").read_text())
    assert summary["parallel"] == "tensor" and summary["test_accuracy"] > 0.15  # chance: 0.1
