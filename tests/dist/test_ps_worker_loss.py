"""`approxdist train --parallel ps --tolerate-worker-loss`: a worker killed mid-run is left
behind and the run finishes, naming it; a killed server still ends the run; torchrun is
refused. The victim is slowed (`--straggler`) so that the kill lands while it trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from approxdist.cli.main import main
from tests.helpers.killed_runs import KilledRun, run_and_kill

FAST = ["--model", "mlp", "--set", "model.hidden=32", "--set", "train.progress=false"]


LEFT_BEHIND = [("async", 2), ("backup:1", 3)]  # (mode, workers): the last worker is killed


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int, str]]:
    """Per case, (run directory, exit code, stderr) of a PS run whose victim was SIGKILLed
    once epoch 1's checkpoint existed; the victim is slowed (`--straggler`) so that the kill
    lands while it trains. The four runs start together (tests/helpers/killed_runs.py);
    every rank's process is gone afterwards."""
    root = tmp_path_factory.mktemp("loss")
    tolerant = ("--tolerate-worker-loss", *FAST)
    runs = {f"{mode}-{workers}": KilledRun(root / mode, workers, (
        "--parallel", "ps", "--straggler", f"{workers}:20ms", "--workers", str(workers),
        "--ps-mode", mode, "--batch-size", str(21 * workers), "--epochs", "6", *tolerant))
        for mode, workers in LEFT_BEHIND}
    runs["server"] = KilledRun(root / "server", 0, (
        "--parallel", "ps", "--straggler", "0:20ms", "--workers", "2", "--ps-mode", "async",
        "--epochs", "500", *tolerant))
    runs["last"] = KilledRun(root / "last", 1, (
        "--parallel", "ps", "--straggler", "1:20ms", "--workers", "1", "--ps-mode", "async",
        "--epochs", "500", *tolerant))
    ended = run_and_kill(runs)
    for run in runs.values():
        for info in (run.out / "workers").glob("rank*.json"):
            pid = json.loads(info.read_text())["pid"]
            assert not Path(f"/proc/{pid}").exists(), f"{info}'s process {pid} is still there"
    return {name: (runs[name].out, *ended[name]) for name in runs}


@pytest.mark.parametrize(("mode", "workers"), LEFT_BEHIND)
def test_a_killed_worker_is_left_behind_and_named(
        killed: dict[str, tuple[Path, int, str]], mode: str, workers: int) -> None:
    out, code, err = killed[f"{mode}-{workers}"]
    victim = workers  # the last worker (servers: rank 0)
    name = f"worker {workers - 1} (rank {victim})"
    assert code == 0, err
    assert f"approxdist: warning: the run lost {name} at step" in err, err
    assert "terminate called" not in err, err  # every survivor exits cleanly
    summary = json.loads((out / "summary.json").read_text())
    lost = summary["ps"]["lost_workers"]
    assert [row["rank"] for row in lost] == [victim] and summary["epochs"] == 6
    assert 0 < lost[0]["step"] < summary["steps"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["kind"] == "epoch"]
    # every epoch after the loss gathers over the survivors and names the lost rank (an
    # epoch that ends at the very step the server took the loss at may have gathered just
    # before the worker died: seen once in a clean-clone CI run, 2026-11-27)
    after = [r for r in epochs if r["step"] > lost[0]["step"]]
    assert after and all(r["lost_ranks"] == [victim] for r in after)
    assert all(victim not in [row["rank"] for row in r["ranks"]] for r in after)
    assert all(0 <= r["test_accuracy"] <= 1 for r in epochs)
    # the dead worker pushed fewer gradients than the survivors
    pushes = summary["ps"]["pushes"]
    assert pushes[victim - 1] < min(pushes[:victim - 1])


def test_a_killed_server_still_ends_a_tolerant_run(
        killed: dict[str, tuple[Path, int, str]]) -> None:
    _, code, err = killed["server"]
    assert code != 0 and "server 0 (rank 0) failed with exit code -9" in err, err


def test_tolerate_worker_loss_under_torchrun_is_refused(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main(["train", "--parallel", "ps", "--workers", "2", "--ps-mode", "async",
                 "--tolerate-worker-loss", *FAST]) == 2
    err = capsys.readouterr().err
    assert "available with the local launcher only" in err and len(err.strip().splitlines()) == 1


def test_losing_the_last_worker_ends_the_run_naming_it(
        killed: dict[str, tuple[Path, int, str]]) -> None:
    _, code, err = killed["last"]
    assert code != 0, err
    assert "lost worker 0 (rank 1) (exit code -9 (SIGKILL))" in err, err  # the warning
    assert "server 0 (rank 0) failed" in err and "0 worker(s) left" in err, err
