"""`approxdist plan` and `approxdist simulate` with a tp axis: a tensor plan file that `train
--plan` runs, the reasons printed, meshes with tp in `simulate`, and bad input one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from approxdist.cli.main import main
from approxdist.config.loader import load_config
from approxdist.planner.cost import CodecCost, DPOptions, LinkLevel, Network
from approxdist.planner.cost.tensor import TPOptions, tp_time
from approxdist.planner.plan_file import read_plan
from approxdist.planner.profile import BlockProfile, Profile, read_profile, write_profile
from approxdist.planner.tp_layout import layout_of
from approxdist.train.plan_layer import plan_sections
from tests.helpers.pipedream import PROFILES

MLP_PLAN = "0.1=colwise,1.0=rowwise,2.0=colwise,3.0=rowwise"


def mlp_profile(tmp_path: Path) -> Path:
    """A profile file of the default mlp on digits (16 samples): its real parameter sizes,
    made-up times (1 ms forward, 2 ms backward a block), so nothing here times anything."""
    cfg = load_config(None, {"model": {"name": "mlp"}, "data": {"dataset": "digits"}}, {})
    lay = layout_of(cfg.model, cfg.data, 16)
    blocks = tuple(BlockProfile(f"block{i}", 1e-3, 2e-3, 16 * 256 * 4,
                                sum(s for s, _ in b.params), 0, 0.0,
                                tuple(s for s, _ in b.params))
                   for i, b in enumerate(lay.blocks))
    path = tmp_path / "mlp.json"
    write_profile(Profile("mlp", (1, 8, 8), 16, 1, "test", "test", blocks, {},
                          {"dataset": "digits"}), path)
    return path


def test_a_tensor_plan_file_holds_its_prediction_and_trains(tmp_path: Path, capsys) -> None:
    profile, out = mlp_profile(tmp_path), tmp_path / "plan.json"
    assert main(["plan", "--profile", str(profile), "--mesh", "tp=2,dp=2",
                 "--link", "bw=1gbit", "--fwd-codec", "bf16", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "chosen: tensor tp=2,dp=2, the only mode priced" in text
    assert "tp allreduce count 3" in text  # mlp's column-row pairs: 3 all-reduces a step
    plan = json.loads(out.read_text())
    assert plan["mode"] == "tensor" and plan["world_size"] == 4
    assert plan["stages"] == [{"blocks": [0, 4], "replicas": 2, "tp": 2}]
    assert plan["tp_plan"] == MLP_PLAN and plan["fwd_codec"] == "bf16"
    # the prediction is tp_time of that mesh on the profile
    prof = read_profile(profile)
    cfg = load_config(None, {"model": {"name": "mlp"}, "data": {"dataset": "digits"}}, {})
    lay = layout_of(cfg.model, cfg.data, 16)
    expected = tp_time(prof, lay, 2, Network(LinkLevel.from_link("inter", "bw=1gbit")),
                       TPOptions(2, CodecCost.of("bf16")), DPOptions()).step_s
    assert plan["predicted"]["time_per_step_s"] == pytest.approx(expected)
    # train --plan runs it in tensor parallelism, its forward codec on the tp wire
    sections = plan_sections(read_plan(out))
    assert sections["train"] == {"parallel": "tensor", "world_size": 4}
    assert sections["tp"] == {"size": 2, "plan": MLP_PLAN}
    assert sections["wire"]["tp_fwd"] == {"codec": "bf16"}
    assert sections["data"]["batch_size"] == 2 * 16  # one micro-batch per replica


def test_plan_prices_every_mode_and_says_why(tmp_path: Path, capsys) -> None:
    assert main(["plan", "--profile", str(mlp_profile(tmp_path)), "--world-size", "4",
                 "--link", "bw=1gbit"]) == 0
    text = capsys.readouterr().out
    why = text[text.index("why:"):]
    for mode in ("tensor", "dp", "pipeline"):
        assert f"\n  {mode} " in why
    assert "tp=4,dp=1" in why or "tp=2,dp=2" in why
    assert "chosen: " in why and "faster per sample than the best of each other mode" in why


def test_simulate_a_mesh_with_tp(tmp_path: Path, capsys) -> None:
    """On a free link (no latency, 1 Pbit/s, gamma 0) splitting mlp's layers over 2 ranks
    halves its compute: s = 2 for tp=2, 4 for tp=2,dp=2 (all but 0.2 % of it is split)."""
    out = tmp_path / "s.json"
    assert main(["simulate", "--profile", str(mlp_profile(tmp_path)), "--mesh", "dp=2",
                 "--mesh", "tp=2", "--mesh", "tp=2,dp=2", "--per-node-batch", "16",
                 "--link", "bw=1000000gbit,lat=0us", "--gamma", "0,0,0",
                 "--compute-scale", "1,1,1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["tp"], r["nodes"], r["ranks"]) for r in rows] == [(1, 2, 2), (2, 1, 2), (2, 2, 4)]
    assert [r["speedup"] for r in rows] == [pytest.approx(2.0, rel=1e-3),
                                            pytest.approx(2.0, rel=1e-2),
                                            pytest.approx(4.0, rel=1e-2)]
    text = capsys.readouterr().out
    assert "tp=2,dp=2" in text and "band at tp=2,dp=2" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--mesh", "tp=3"], "tp size 3 does not divide the 256 output features of 0.1"),
    (["--mesh", "tp=2,dp=2", "--world-size", "3"],
     "--mesh tp=2,dp=2 holds 4 rank(s) but --world-size is 3"),
    (["--world-size", "4", "--tp", "3"], "--tp 3 does not divide the world of 4 rank(s)"),
    (["--mesh", "pp=2,dp=2"], "plan --mesh takes tp and dp axes, not pp=2"),
    (["--mesh", "tp=2", "--tp", "2"], "--mesh tp=2 says the tp size; drop --tp 2"),
    (["--mesh", "tp=2", "--tp-plan", "0.1=colwise,9.0=rowwise"], "9.0"),
])
def test_plan_bad_tp_input_is_one_line_exit_2(tmp_path: Path, capsys, args: list[str],
                                              message: str) -> None:
    assert main(["plan", "--profile", str(mlp_profile(tmp_path)), "--link", "bw=1gbit",
                 *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--mesh", "tp=3"], "tp size 3 does not divide the 256 output features of 0.1"),
    (["--mesh", "tp=2", "--nodes", "4"], "--nodes 4 and --mesh tp=2 both say the ranks"),
    (["--mesh", "pp=2,tp=2"], "simulate prices data and tensor parallelism"),
])
def test_simulate_bad_tp_input_is_one_line_exit_2(tmp_path: Path, capsys, args: list[str],
                                                  message: str) -> None:
    assert main(["simulate", "--profile", str(mlp_profile(tmp_path)), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_profile_without_its_model_cannot_be_split(capsys) -> None:
    assert main(["simulate", "--profile", str(PROFILES / "alexnet.txt"),
                 "--mesh", "tp=2,dp=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not record its model options and data set" in err
    assert len(err.splitlines()) == 1
