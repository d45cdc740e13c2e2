"""`approxdist train --resume` checks the saved run before it writes anything or starts a
worker: every mismatch, damaged or missing checkpoint is one line with exit 2 and leaves
the run directory byte for byte as it was; a resume that matches trains on. Also the
run directory that cannot be made, and torchrun's world against the run's."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from approxdist.cli.main import main
from approxdist.train.checkpoint import NAME
from approxdist.train.metrics import read_jsonl

FAST = ["--model", "mlp", "--set", "model.hidden=32", "--set", "train.progress=false"]
RUNS = {"dp": ["--parallel", "dp", "--world-size", "2"],
        "pp": ["--parallel", "pipeline", "--stages", "2"],
        "ps": ["--parallel", "ps", "--workers", "2"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One finished 1-epoch run of each kind (tests copy them before changing them)."""
    root = tmp_path_factory.mktemp("runs")
    for name, args in RUNS.items():
        assert main(["train", *args, "--epochs", "1", "--out", str(root / name), *FAST]) == 0
    return {name: root / name for name in RUNS}


def _copy(runs: dict[str, Path], name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(runs[name], tmp_path / name))


def _snapshot(run_dir: Path) -> dict[str, tuple[str, int]]:
    """Every file of a run directory: its content's digest and its modification time."""
    return {str(p.relative_to(run_dir)): (hashlib.sha256(p.read_bytes()).hexdigest(),
                                          p.stat().st_mtime_ns)
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize(("run", "args", "message"), [
    ("dp", ["--parallel", "pipeline", "--stages", "2"],
     "the run was trained with train.parallel = 'dp' and this asks for 'pipeline' "
     "(--parallel); a resumed run keeps its parallel mode: drop --parallel, or start a new "
     "run with --out DIR"),
    ("pp", ["--split", "3"],
     "the run was trained with pipeline.split = '' and this asks for '3' (--split); a "
     "resumed run keeps its pipeline partition: drop --split"),
    ("pp", ["--schedule", "1f1b"], "pipeline.schedule = 'gpipe' and this asks for '1f1b'"),
    ("pp", ["--mesh", "pp=3"], "train.mesh = 'pp=2,dp=1' and this asks for 'pp=3' (--mesh)"),
    ("ps", ["--parallel", "dp"], "train.parallel = 'ps' and this asks for 'dp' (--parallel)"),
    ("ps", ["--workers", "3"], "ps.workers = 2 and this asks for 3 (--workers); a resumed "
                               "run keeps its workers: drop --workers"),
    ("dp", ["--world-size", "4"], "train.world_size = 2 and this asks for 4 (--world-size)"),
    ("dp", ["--set", "model.hidden=64"],
     "model.hidden = 32 and this asks for 64 (--set model.hidden)"),
    ("dp", ["--epochs", "1"], "the run has trained 1 of its 1 epochs already; ask for more "
                              "with --epochs 2 or more"),
])
def test_a_resume_that_contradicts_the_saved_run_is_one_line_and_writes_nothing(
        runs: dict[str, Path], run: str, args: list[str], message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    before = _snapshot(runs[run])
    epochs = [] if "--epochs" in args else ["--epochs", "2"]
    err = _refused(["--resume", str(runs[run]), *args, *epochs], capsys)
    assert err.startswith(f"approxdist: error: --resume '{runs[run]}': ") and message in err
    assert _snapshot(runs[run]) == before
    assert main(["train", "--resume", str(runs[run]), "--epochs", "2", "--check"]) == 0
    assert f"-> {runs[run]} (resumes after epoch 1 of 2); nothing was written" \
        in capsys.readouterr().out
    assert _snapshot(runs[run]) == before


def test_damaged_missing_or_disagreeing_checkpoints_are_one_line(
        runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dp = _copy(runs, "dp", tmp_path)
    whole = (dp / NAME).read_bytes()
    (dp / NAME).write_bytes(whole[: len(whole) // 3])
    before = _snapshot(dp)
    err = _refused(["--resume", str(dp), "--epochs", "2"], capsys)
    assert f"checkpoint '{dp / NAME}' cannot be read (" in err and len(err) < 500
    assert err.endswith("restore it from a copy, or start a new run with --out DIR\n")
    assert _snapshot(dp) == before
    (dp / "config.toml").write_text("[train\n")
    assert "config file '" in _refused(["--resume", str(dp), "--epochs", "2"], capsys)

    pp = _copy(runs, "pp", tmp_path)
    stage1 = torch.load(pp / "stage1" / NAME, weights_only=True)
    torch.save({**stage1, "epoch": 0}, pp / "stage1" / NAME)
    err = _refused(["--resume", str(pp), "--epochs", "2"], capsys)
    assert "stage checkpoints disagree: stage 0 at epoch 1; stage 1 at epoch 0; a stage died " \
           "while saving" in err
    (pp / "stage1" / NAME).unlink()
    before = _snapshot(pp)
    err = _refused(["--resume", str(pp), "--epochs", "2"], capsys)
    assert f"{pp / 'stage1' / NAME} is missing while the other checkpoints are there " \
           f"(epoch 1)" in err
    assert _snapshot(pp) == before


def test_a_ps_run_resumed_without_world_size_trains_only_the_epochs_left(
        runs: dict[str, Path], tmp_path: Path) -> None:
    ps = _copy(runs, "ps", tmp_path)
    config = (ps / "config.toml").read_text()
    assert main(["train", "--resume", str(ps), "--epochs", "2"]) == 0
    summary = json.loads((ps / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["world_size"] == 3
    epochs = [r["epoch"] for r in read_jsonl(ps / "metrics.jsonl") if r["kind"] == "epoch"]
    assert epochs == [1, 2]  # one epoch trained after the saved one, none again
    assert (ps / "config.toml").read_text() == config.replace("epochs = 1\n", "epochs = 2\n")


def test_out_that_cannot_be_made_is_one_line_before_any_worker(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    err = _refused(["--out", str(afile / "run"), "--epochs", "1", *FAST], capsys)
    assert f"--out '{afile / 'run'}': cannot make that folder (" in err
    assert main(["train", "--out", str(afile / "run"), "--check", *FAST]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize(("world", "args", "message"), [
    ("3", ["--world-size", "2"], "torchrun started 3 ranks (WORLD_SIZE=3) but the run asks "
                                 "for 2 (--world-size); start torchrun with 2 ranks in all"),
    ("3", ["--parallel", "pipeline", "--stages", "2"], "asks for 2 (--stages)"),
    ("4", ["--parallel", "ps", "--workers", "2"], "asks for 3 (--workers)"),
    ("3", ["--plan", "PLAN"], "asks for 2 (--plan PLAN)"),
    ("x", [], "WORLD_SIZE='x' in the environment is not a number"),
])
def test_torchrun_world_against_the_runs_is_one_line(
        world: str, args: list[str], message: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"stages": [{"replicas": 2}]}))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", world)
    args = [str(plan) if a == "PLAN" else a for a in args]
    err = _refused([*args, "--out", str(tmp_path / "run"), *FAST], capsys)
    assert message.replace("PLAN", str(plan)) in err
    assert not (tmp_path / "run").exists()


def test_torchrun_world_is_the_runs_when_nothing_else_says_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main(["train", "--batch-size", "63", "--check", "--out", str(tmp_path / "run"),
                 *FAST]) == 0
    assert "check passed: dp x3" in capsys.readouterr().out
    assert main(["train", "--parallel", "pipeline", "--check", *FAST]) == 0
    assert "check passed: pipeline x3" in capsys.readouterr().out
    assert not (tmp_path / "run").exists()
