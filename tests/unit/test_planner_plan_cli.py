"""`approxdist plan`: plan files from a profile, PipeDream's objective through the command,
`train --plan`'s config layer, and one-line errors (exit 2) for bad input."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from approxdist.cli.main import build_parser, main
from approxdist.cli.train_cmd import resolve
from approxdist.errors import ConfigError
from approxdist.planner import read_pipedream_profile
from approxdist.planner.cost import (
    CodecCost,
    LinkLevel,
    Network,
    PipelinePlan,
    Stage,
    dp_time,
    pipeline_time,
)
from approxdist.planner.kinds import kind_of
from approxdist.planner.plan_file import parse_plan, read_plan, write_plan
from approxdist.topology import Mesh
from approxdist.train.mode import modes, plan_mode
from approxdist.train.plan_layer import plan_sections
from tests.helpers.pipedream import PROFILES

ALEXNET = str(PROFILES / "alexnet.txt")
AT_1GBS = ["--profile", ALEXNET, "--world-size", "4", "--link", "bw=8gbit"]


@pytest.mark.parametrize(("flags", "bottleneck_ms"), [
    ([], 23.17), (["--activation-compression-ratio", "1"], 34.22),
    (["--activation-compression-ratio", "1", "--straight-pipeline"], 66.45)])
def test_pipedream_objective_through_the_command(tmp_path: Path, capsys, flags: list[str],
                                                 bottleneck_ms: float) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", *AT_1GBS, "--objective", "pipedream", *flags, "--microbatches", "4",
                 "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert round(plan["predicted"]["bottleneck_s"] * 1e3, 2) == bottleneck_ms
    assert f"bottleneck {bottleneck_ms:.2f} ms" in capsys.readouterr().out
    assert plan["objective"] == "pipedream" and plan["world_size"] == 4


def test_plan_file_holds_the_contract_and_its_prediction(tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", *AT_1GBS, "--microbatches", "4,8", "--fwd-codec", "bf16",
                 "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert {"model", "world_size", "stages", "schedule", "microbatches", "fwd_codec",
            "bwd_codec", "grad_codec", "link", "predicted"} <= set(plan)
    assert plan["fwd_codec"] == "bf16" and plan["bwd_codec"] == "fp32"
    assert plan["link"]["link"] == "bw=8gbit"
    # a profile file records the input shape, not model options or a data set
    assert plan["input_shape"] == [3, 224, 224] and "model_options" not in plan
    # the prediction is the event simulation (or dp_time) of the plan written
    profile = read_pipedream_profile(ALEXNET)
    net = Network(LinkLevel.from_link("inter", "bw=8gbit"))
    stages = tuple(Stage(*s["blocks"], s["replicas"]) for s in plan["stages"])
    if plan["mode"] == "dp":
        expected = dp_time(profile, 4, net).step_s
    else:
        expected = pipeline_time(profile, PipelinePlan(
            stages, plan["schedule"], plan["microbatches"], CodecCost.of("bf16")), net).step_s
    assert plan["predicted"]["time_per_step_s"] == pytest.approx(expected)
    text = capsys.readouterr().out
    per_sample = [float(line.split()[-4]) for line in text.splitlines()
                  if line[:2].strip().isdigit()]
    assert per_sample == sorted(per_sample) and len(per_sample) >= 2
    # plan show reads it
    assert main(["plan", "show", str(out)]) == 0
    assert f"mesh pp={len(stages)},dp=" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", "2", "--per-node", "3"], "--world-size 4 cannot be formed by --nodes 2 x "
                                          "--per-node 3 = 6"),
    (["--stages", "30"], "30 stages for a model of 22 blocks (alexnet); use 1..22 stages"),
    (["--stages", "5"], "5 stages need at least 5 ranks, the world size is 4"),
    (["--memory", "1e6"], "fits --memory 1000000 bytes per rank: block"),
    (["--model", "resnet20"], "is of model 'alexnet', not --model 'resnet20'"),
    (["--microbatches", "x"], "--microbatches 'x' is not auto or a comma list"),
    (["--load-probe"], "--load-probe probes the model on this machine's ranks; --profile"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, capsys) -> None:
    assert main(["plan", *AT_1GBS, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_foreign_or_missing_profile_and_missing_link(tmp_path: Path, capsys) -> None:
    foreign = tmp_path / "metrics.json"
    foreign.write_text('{"loss": 1}')
    assert main(["plan", "--profile", str(foreign), "--world-size", "2", "--link", "bw=1gbit"]) == 2
    assert "is not an approxdist profile" in capsys.readouterr().err
    assert main(["plan", "--profile", str(tmp_path / "none.json"), "--world-size", "2",
                 "--link", "bw=1gbit"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["plan", "--profile", ALEXNET, "--world-size", "2"]) == 2
    assert "say what joins the ranks" in capsys.readouterr().err


def test_plan_file_becomes_train_config() -> None:
    hybrid = parse_plan({"model": "mlp", "micro_batch_size": 16, "world_size": 3,
                         "stages": [{"blocks": [0, 1], "replicas": 1},
                                    {"blocks": [1, 4], "replicas": 2}],
                         "schedule": "1f1b", "microbatches": 6, "fwd_codec": "bf16",
                         "grad_codec": "fp16", "algorithm": "ring"})
    assert plan_sections(hybrid) == {
        "train": {"parallel": "hybrid", "world_size": 3}, "model": {"name": "mlp"},
        "pipeline": {"stages": 2, "split": "1", "replicas": [1, 2], "microbatches": 6,
                     "schedule": "1f1b"},
        "wire": {"fwd": {"codec": "bf16"}, "grad": {"codec": "fp16"}},
        "dp": {"algorithm": "ring"}, "data": {"batch_size": 96}}
    dp = parse_plan({"micro_batch_size": 8, "stages": [{"replicas": 4}]})
    assert plan_sections(dp) == {"train": {"parallel": "dp", "world_size": 4},
                                 "data": {"batch_size": 32}}
    pipe = parse_plan({"stages": [{"blocks": [0, 2], "replicas": 1, "ranks": [1]},
                                  {"blocks": [2, 5], "replicas": 1, "ranks": [0]}]})
    assert plan_sections(pipe)["pipeline"] == {"stages": 2, "split": "2", "placement": [1, 0]}


@pytest.mark.parametrize(("stages", "mode"), [
    ([{"replicas": 1}], "single"), ([{"replicas": 3}], "dp"),
    ([{"replicas": 1}, {"replicas": 1}], "pipeline"),
    ([{"replicas": 1}, {"replicas": 1, "tp": 1}], "pipeline"),
    ([{"replicas": 2}, {"replicas": 1}], "hybrid"), ([{"replicas": 1, "tp": 2}], "tensor"),
    ([{"replicas": 2, "tp": 2}], "tensor")])
def test_the_mode_record_that_runs_a_plan_says_so(stages: list, mode: str) -> None:
    """Each plan's mesh is of one kind of the planner's table, and exactly one record runs
    that kind (so a new mode adds its own row and record, and none of the others changes)."""
    mesh = parse_plan({"stages": stages}).mesh
    kind = kind_of(mesh.used)
    assert kind is not None and kind.name == mode
    takers = [m for m in modes().names() if modes().get(m).plan == kind]
    assert takers == [mode] and plan_mode(mesh).name == mode


def test_a_mesh_no_mode_plans_for_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"a plan of mesh role=2,dp=1/2 \(parameter server\) "
                                          r"is run by no mode"):
        plan_mode(Mesh.roles(1, 2))


def test_train_reads_the_plan_under_its_flags(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"model": "mlp", "micro_batch_size": 16,
                                "stages": [{"blocks": [0, 2], "replicas": 2},
                                           {"blocks": [2, 4], "replicas": 1}],
                                "schedule": "1f1b", "microbatches": 4}))
    args = build_parser().parse_args(["train", "--plan", str(path), "--microbatches", "8",
                                      "--out", str(tmp_path / "run")])
    cfg = resolve(args)[0]
    assert (cfg.train.parallel, cfg.train.world_size, cfg.model.name) == ("hybrid", 3, "mlp")
    assert (cfg.pipeline.split, cfg.pipeline.replica_counts, cfg.pipeline.schedule) == \
        ("2", (2, 1), "1f1b")
    assert cfg.pipeline.microbatches == 8 and cfg.data.batch_size == 64  # the flag wins


@pytest.mark.parametrize(("plan", "message"), [
    ({"stages": [{"blocks": [0, 2], "replicas": 1}, {"replicas": 1}]},
     "'blocks' is given for some stages only"),
    ({"stages": [{"blocks": [0, 2], "replicas": 1}, {"blocks": [3, 4], "replicas": 1}]},
     "stages[1].blocks = [3, 4] must start where stage 0 ends (block 2)"),
    ({"stages": [{"replicas": 2}], "microbatches": 0}, "microbatches = 0 must be an integer"),
    ({"stages": [{"replicas": 2}], "model_options": {"hiden": 3}},
     "model_options has unknown key 'hiden'; known: shortcut, width, hidden"),
    ({"stages": [{"replicas": 2}], "data": "digits"}, "data = 'digits' must be an object of"),
    ({"stages": [{"replicas": 2}], "input_shape": [3, 0]},
     "input_shape = [3, 0] must be a non-empty list of sizes >= 1"),
    # written before the size-picking all-reduce was renamed `auto`
    ({"stages": [{"replicas": 2}], "algorithm": "hybrid"},
     "algorithm = 'hybrid' is not an all-reduce algorithm; valid: auto, brb, brd, native, "
     "ring, vhd"),
])
def test_bad_plan_files_name_the_value(tmp_path: Path, plan: dict, message: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    with pytest.raises(ConfigError) as err:
        read_plan(path)
    assert message in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


PLANNED = {"model": "mlp", "model_options": {"hidden": 48, "depth": 2},
           "data": {"dataset": "synthetic", "synthetic_shape": [12], "synthetic_samples": 96},
           "input_shape": [12], "micro_batch_size": 8,
           "stages": [{"blocks": [0, 1], "replicas": 1}, {"blocks": [1, 3], "replicas": 1}]}


def test_what_was_planned_for_round_trips_and_binds_train(tmp_path: Path, capsys) -> None:
    path = write_plan(PLANNED, tmp_path / "plan.json")
    plan = read_plan(path)
    assert (plan.model, plan.model_options, plan.data, plan.input_shape) == (
        "mlp", {"hidden": 48, "depth": 2}, PLANNED["data"], (12,))
    assert parse_plan(json.loads(path.read_text())) == plan
    cfg = resolve(build_parser().parse_args(["train", "--plan", str(path)]))[0]
    assert (cfg.model.name, cfg.model.hidden, cfg.model.depth) == ("mlp", 48, 2)
    assert (cfg.data.dataset, cfg.data.synthetic_shape, cfg.data.batch_size) == \
        ("synthetic", (12,), 8)  # one micro-batch of 8: the file names no count
    # the same values again are no contradiction
    cfg = resolve(build_parser().parse_args(["train", "--plan", str(path), "--model", "mlp",
                                             "--set", "model.hidden=48"]))[0]
    assert cfg.model.hidden == 48
    assert main(["plan", "show", str(path)]) == 0
    assert ("planned for: model mlp (depth=2, hidden=48), data synthetic (synthetic_samples=96, "
            "synthetic_shape=[12]), input [12] x micro-batch 8") in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "message"), [
    (["--set", "model.hidden=64"], "--set model.hidden=64 contradicts plan file {path!r}, made "
                                   "for model.hidden = 48; drop the flag"),
    (["--model", "resnet20"], "--model 'resnet20' contradicts plan file {path!r}, made for "
                              "model.name = 'mlp'"),
    (["--dataset", "digits"], "--dataset 'digits' contradicts plan file {path!r}, made for "
                              "data.dataset = 'synthetic'"),
    (["--set", "data.synthetic_shape=[3,4]"], "--set data.synthetic_shape=[3, 4] contradicts "
                                              "plan file {path!r}, made for data.synthetic_shape "
                                              "= [12]"),
])
def test_a_flag_that_contradicts_the_plan_is_one_line_exit_2(tmp_path: Path, capsys,
                                                              flags: list[str],
                                                              message: str) -> None:
    path = str(write_plan(PLANNED, tmp_path / "plan.json"))
    assert main(["train", "--plan", path, *flags, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert message.format(path=path) in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_samples_of_another_shape_than_profiled_are_one_line_exit_2(tmp_path: Path,
                                                                    capsys) -> None:
    path = str(write_plan({**PLANNED, "input_shape": [3, 32, 32]}, tmp_path / "plan.json"))
    assert main(["train", "--plan", path, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert (f"data set 'synthetic' has samples of shape [12]; plan file {path!r} was profiled "
            f"on [3, 32, 32]") in err and len(err.splitlines()) == 1


def test_an_old_plan_file_leaves_model_options_and_data_to_the_command_line(
        tmp_path: Path) -> None:
    old = {k: v for k, v in PLANNED.items() if k not in ("model_options", "data", "input_shape")}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": "approxdist-plan", "version": 1, **old}))
    plan = read_plan(path)
    assert (plan.model_options, plan.data, plan.input_shape) == (None, None, None)
    cfg = resolve(build_parser().parse_args(["train", "--plan", str(path), "--dataset",
                                             "synthetic", "--set", "model.hidden=64"]))[0]
    assert (cfg.model.name, cfg.model.hidden, cfg.data.dataset) == ("mlp", 64, "synthetic")


def test_a_saved_profile_carries_what_it_measured_into_the_plan(tmp_path: Path) -> None:
    """`plan profile` records the model's options and data set; `plan --profile` writes
    them into the plan, so `train --plan` alone trains what was profiled and planned."""
    prof, plan = tmp_path / "mlp.json", tmp_path / "plan.json"
    assert main(["plan", "profile", "--model", "mlp", "--set", "model.hidden=24",
                 "--dataset", "synthetic", "--set", "data.synthetic_shape=[10]",
                 "--microbatch-size", "4", "--threads", "1", "--repeat", "1",
                 "--json", str(prof)]) == 0
    assert main(["plan", "--profile", str(prof), "--world-size", "2", "--link", "bw=1gbit",
                 "--json", str(plan)]) == 0
    got = read_plan(plan)
    assert got.model == "mlp" and got.model_options is not None and got.data is not None
    assert got.model_options["hidden"] == 24 and got.data["synthetic_shape"] == [10]
    cfg = resolve(build_parser().parse_args(["train", "--plan", str(plan)]))[0]
    assert (cfg.model.hidden, cfg.data.dataset, cfg.data.synthetic_shape) == \
        (24, "synthetic", (10,))
    # PipeDream's profiles say nothing of the model's options: the plan leaves them out
    assert main(["plan", "--profile", str(PROFILES / "alexnet.txt"), "--world-size", "2",
                 "--link", "bw=8gbit", "--json", str(plan)]) == 0
    assert read_plan(plan).model_options is None


def test_the_printed_next_step_trains_a_profile_that_names_no_data_set(tmp_path: Path,
                                                                       capsys) -> None:
    """A profile without a data set of ours (PipeDream's, or one with its data left out)
    was profiled on samples the default data set does not have: the printed command asks
    for samples of that shape, and passes `train --check` as printed."""
    prof, plan = tmp_path / "mlp.json", tmp_path / "plan.json"
    assert main(["plan", "profile", "--model", "mlp", "--set", "model.hidden=24",
                 "--dataset", "synthetic", "--set", "data.synthetic_shape=[10]",
                 "--microbatch-size", "4", "--threads", "1", "--repeat", "1",
                 "--json", str(prof)]) == 0
    saved = json.loads(prof.read_text())
    prof.write_text(json.dumps({k: v for k, v in saved.items() if k != "data"}))
    capsys.readouterr()
    assert main(["plan", "--profile", str(prof), "--world-size", "2", "--link", "bw=1gbit",
                 "--json", str(plan)]) == 0
    printed = re.search(r"\(run it: (approxdist train [^;]*); the profile names no data set: "
                        r"these are random samples of the shape it was profiled on\)",
                        capsys.readouterr().out)
    assert printed, "no next step printed"
    command = shlex.split(printed.group(1))
    assert command[-2:] == ["--set", "data.synthetic_shape=[10]"]
    assert main([*command[1:], "--check", "--out", str(tmp_path / "run")]) == 0
    assert "check passed" in capsys.readouterr().out
    # the data set named by the profile needs no more than the plan
    prof.write_text(json.dumps(saved))
    assert main(["plan", "--profile", str(prof), "--world-size", "2", "--link", "bw=1gbit",
                 "--json", str(plan)]) == 0
    assert f"(run it: approxdist train --plan {plan})" in capsys.readouterr().out
