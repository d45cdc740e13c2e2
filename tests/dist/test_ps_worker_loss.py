"""`approxdist train --parallel ps --tolerate-worker-loss`: a worker killed mid-run is left
behind and the run finishes, naming it; a killed server still ends the run; torchrun is
refused. The victim is slowed (`--straggler`) so that the kill lands while it trains."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from approxdist.cli.main import main
from tests.helpers.waiting import wait_for_file

FAST = ["--model", "mlp", "--set", "model.hidden=32", "--set", "train.progress=false"]


def _kill_during_run(out: Path, victim: int, *args: str) -> tuple[int, str]:
    """Start a PS run, SIGKILL rank `victim` once epoch 1's checkpoint exists; (exit code,
    stderr). Every rank's process is gone afterwards."""
    proc = subprocess.Popen([sys.executable, "-m", "approxdist", "train", "--parallel", "ps",
                             "--out", str(out), "--straggler", f"{victim}:20ms", *args, *FAST],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_file(out / "checkpoint.pt", 120, proc)
        pid = json.loads((out / "workers" / f"rank{victim}.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    for info in (out / "workers").glob("rank*.json"):
        pid = json.loads(info.read_text())["pid"]
        assert not Path(f"/proc/{pid}").exists(), f"{info.name}'s process {pid} is still there"
    return proc.returncode, err


@pytest.mark.parametrize(("mode", "workers"), [("async", 2), ("backup:1", 3)])
def test_a_killed_worker_is_left_behind_and_named(tmp_path: Path, mode: str,
                                                  workers: int) -> None:
    out, victim = tmp_path / "run", workers  # the last worker (servers: rank 0)
    code, err = _kill_during_run(out, victim, "--workers", str(workers), "--ps-mode", mode,
                                 "--batch-size", str(21 * workers), "--epochs", "6",
                                 "--tolerate-worker-loss")
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


def test_a_killed_server_still_ends_a_tolerant_run(tmp_path: Path) -> None:
    code, err = _kill_during_run(tmp_path / "run", 0, "--workers", "2", "--ps-mode", "async",
                                 "--epochs", "500", "--tolerate-worker-loss")
    assert code != 0 and "server 0 (rank 0) failed with exit code -9" in err, err


def test_tolerate_worker_loss_under_torchrun_is_refused(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main(["train", "--parallel", "ps", "--workers", "2", "--ps-mode", "async",
                 "--tolerate-worker-loss", *FAST]) == 2
    err = capsys.readouterr().err
    assert "available with the local launcher only" in err and len(err.strip().splitlines()) == 1


def test_losing_the_last_worker_ends_the_run_naming_it(tmp_path: Path) -> None:
    code, err = _kill_during_run(tmp_path / "run", 1, "--workers", "1", "--ps-mode", "async",
                                 "--epochs", "500", "--tolerate-worker-loss")
    assert code != 0, err
    assert "lost worker 0 (rank 1) (exit code -9 (SIGKILL))" in err, err  # the warning
    assert "server 0 (rank 0) failed" in err and "0 worker(s) left" in err, err
