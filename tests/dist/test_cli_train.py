"""`approxdist train` end to end: the elastic launcher, run outputs, bad input, a killed worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from approxdist.cli.main import main
from approxdist.train.metrics import read_jsonl
from tests.helpers.tensorboard import epoch_figures, read_events
from tests.helpers.waiting import alive, wait_for_file, wait_until

FAST = ["--model", "mlp", "--set", "model.hidden=32", "--set", "train.progress=false"]


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "approxdist", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_main_job_reaches_95_percent_and_writes_all_outputs(tmp_path: Path) -> None:
    """The main job as the README runs it (defaults: digits, ResNet-20, 2 workers, dp)."""
    out = tmp_path / "run"
    res = _cli("train", "--out", str(out), "--set", "train.progress=false", timeout=300)
    assert res.returncode == 0, res.stderr
    assert "test accuracy" in res.stdout
    assert {"config.toml", "metrics.jsonl", "summary.json", "checkpoint.pt"} <= {
        p.name for p in out.iterdir()}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["epochs"] == 15
    assert summary["bytes_sent"] > 0 and summary["test_accuracy"] >= 0.95
    epochs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
              if json.loads(line)["kind"] == "epoch"]
    assert [e["epoch"] for e in epochs] == list(range(1, 16))
    assert {"train_loss", "test_accuracy", "samples_per_s", "bytes_sent", "time_compute_s",
            "time_comm_s", "time_wait_s", "step_time_s"} <= set(epochs[0])
    assert 0 < epochs[0]["step_time_s"] < epochs[0]["epoch_time_s"]
    assert sorted(p.name for p in (out / "workers").iterdir()) == ["rank0.json", "rank1.json"]


def test_single_in_process_and_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run resumed for a second epoch; with --tensorboard its event files (appended to by
    the resumed run, config.toml keeping the folder) hold metrics.jsonl's figures."""
    out, tb = tmp_path / "single", tmp_path / "tb"
    assert main(["train", "--parallel", "single", "--epochs", "1", "--out", str(out),
                 "--tensorboard", str(tb), *FAST]) == 0
    assert main(["train", "--resume", str(out), "--epochs", "2"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["world_size"] == 1
    assert summary["diverged_at_step"] is None  # every loss finite
    records = read_jsonl(out / "metrics.jsonl")
    scalars, _ = read_events(tb)
    assert len(list(tb.glob("events.out.tfevents.*"))) == 2  # one per run, one folder
    assert {t: v for t, v in scalars.items() if not t.startswith("train/")} \
        == epoch_figures(records)
    steps = [r for r in records if r["kind"] == "step"]
    assert [s for s, _ in scalars["train/loss"]] == [r["step"] for r in steps]
    assert [s for s, _ in scalars["test/accuracy"]] == [summary["steps"] // 2, summary["steps"]]


def test_a_diverged_run_stops_after_its_epoch_and_says_where(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A learning rate that blows the loss up: the run warns naming the step, records it in
    summary.json and stops after that epoch (on 2 ranks too: both stop, no hang);
    `train.on_divergence=continue` trains every epoch."""
    blow_up = ["--epochs", "3", "--set", "optim.lr=1e8", "--set", "optim.momentum=0.9", *FAST]
    single = tmp_path / "single"
    assert main(["train", "--parallel", "single", "--out", str(single), *blow_up]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((single / "summary.json").read_text())
    assert summary["epochs"] == 1 and isinstance(summary["diverged_at_step"], int)
    assert "training diverged: the loss was" in printed
    assert f"at step {summary['diverged_at_step']} (epoch 1)" in printed
    steps = [json.loads(line) for line in (single / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in steps if r["kind"] == "step" and r["step"] < summary["diverged_at_step"]]
    assert all(r["loss"] == r["loss"] and abs(r["loss"]) != float("inf") for r in logged)
    # a fresh run in the same directory replaces the earlier one's outputs, saying so
    assert main(["train", "--parallel", "single", "--out", str(single), *blow_up,
                 "--set", "train.on_divergence=continue"]) == 0
    assert "held an earlier run; replaced its checkpoint.pt, metrics.jsonl, summary.json" \
        in capsys.readouterr().err
    assert json.loads((single / "summary.json").read_text())["epochs"] == 3
    epochs = [json.loads(line)["epoch"] for line in (single / "metrics.jsonl").read_text()
              .splitlines() if json.loads(line)["kind"] == "epoch"]
    assert epochs == [1, 2, 3]  # not appended to the stopped run's epoch 1
    dp = tmp_path / "dp"
    assert main(["train", "--parallel", "dp", "--world-size", "2", "--out", str(dp),
                 *blow_up]) == 0, capsys.readouterr().err
    summary = json.loads((dp / "summary.json").read_text())
    assert summary["epochs"] == 1 and summary["diverged_at_step"] is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-size", "0"], "train.world_size = 0 must be >= 1"),
        (["--batch-size", "63"], "must be divisible by the world size (2)"),
        (["--set", "optim.bogus=1"], "unknown key optim.bogus"),
        (["--dataset", "cifar10", "--data-dir", "/nonexistent"], "does not exist"),
        (["--resume", "/nonexistent"], "no config.toml there"),
        (["--algorithm", "tree"], "dp.algorithm = 'tree' is not one of"),
        (["--codec", "fp7"], "wire.grad.codec = 'fp7': unknown codec spec"),
        (["--codec-rule", "*.bias=fp7"], "wire.grad.rules = '*.bias=fp7': unknown codec spec"),
        (["--link", "bw=fast"], "comm.link = 'bw=fast': bandwidth 'fast'"),
        # a flag (or a key) the mode does not read is refused, never ignored
        (["--parallel", "dp", "--placement", "1,0"],
         "--placement sets pipeline.placement, which --parallel dp does not use; drop it, or "
         "use --parallel hybrid or pipeline"),
        (["--parallel", "dp", "--fwd-codec", "bf16"],
         "--fwd-codec sets wire.fwd.codec, which --parallel dp does not use"),
        (["--parallel", "dp", "--schedule", "1f1b"],
         "--schedule sets pipeline.schedule, which --parallel dp does not use"),
        (["--parallel", "single", "--codec", "bf16"],
         "--codec sets wire.grad.codec, which --parallel single does not use; drop it, or use "
         "--parallel dp or hybrid"),
        (["--parallel", "single", "--link", "bw=1gbit"],
         "--link sets comm.link, which --parallel single does not use"),
        (["--parallel", "pipeline", "--codec", "bf16"],
         "--codec sets wire.grad.codec, which --parallel pipeline does not use"),
        (["--parallel", "dp", "--set", "pipeline.schedule=1f1b"],
         "pipeline.schedule = '1f1b' is not used by --parallel dp; drop it, or use --parallel "
         "hybrid or pipeline"),
        # meshes of named axes
        (["--parallel", "dp", "--mesh", "pp=2,dp=2"],
         "--parallel dp runs on axes dp, not pp=2 (mesh pp=2,dp=2); drop the axis or use "
         "--parallel hybrid"),
        (["--parallel", "hybrid", "--mesh", "pp=2,dp=0"], "axis dp has size 0"),
        (["--parallel", "hybrid", "--mesh", "pp=2,xp=2"], "axis 'xp' is not one of: role, pp, dp"),
        (["--parallel", "hybrid", "--mesh", "pp=2,pp=2"], "names axis 'pp' twice"),
        (["--parallel", "hybrid", "--mesh", "pp=2,dp=2", "--world-size", "3"],
         "train.world_size = 3 but the mesh pp=2,dp=2 says 4"),
        (["--parallel", "pipeline", "--mesh", "pp=2,dp=2"],
         "--parallel pipeline runs on axes pp, tp, not dp=2"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], message: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_tensorboard_into_a_folder_that_cannot_be_made_is_one_line_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    assert main(["train", "--tensorboard", str(afile / "tb"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"train.tensorboard = '{afile / 'tb'}': cannot make or write that folder" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()  # before any worker started


def test_killed_worker_ends_the_run(tmp_path: Path) -> None:
    out = tmp_path / "fault"
    proc = subprocess.Popen([sys.executable, "-m", "approxdist", "train", "--epochs", "500",
                             "--out", str(out), *FAST], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for_file(out / "workers" / "rank1.json", 60, proc)
        wait_for_file(out / "checkpoint.pt", 60, proc)  # mid-run: at least one epoch done
        pids = {r: json.loads((out / "workers" / f"rank{r}.json").read_text())["pid"] for r in (0, 1)}
        os.kill(pids[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "rank 1 (stage 0, replica 1) failed" in err and "SIGKILL" in err, err
    wait_until(lambda: not alive(pids[0]), "rank 0 was left running", 30)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_bind_cores_row_puts_a_stages_replicas_on_different_cores(tmp_path: Path) -> None:
    """`--bind-cores row` on a 2 x 2 hybrid: each rank's cores (workers/rankN.json) are its
    pipeline row's share of the machine's, so a stage's two replicas never share one. With
    --tensorboard rank 0 alone writes the epoch's figures (each link's bytes) there."""
    from approxdist.launch.affinity import plan_cores

    out, tb = tmp_path / "bound", tmp_path / "tb"
    assert main(["train", "--parallel", "hybrid", "--stages", "2", "--replicas", "2",
                 "--microbatches", "2", "--batch-size", "16", "--epochs", "1",
                 "--dataset", "synthetic", "--set", "data.synthetic_shape=[12]",
                 "--set", "data.synthetic_samples=64", "--set", "data.augment=false",
                 "--bind-cores", "row", "--out", str(out), "--tensorboard", str(tb), *FAST]) == 0
    cores = {r: json.loads((out / "workers" / f"rank{r}.json").read_text())["cores"]
             for r in range(4)}
    machine = sorted(os.sched_getaffinity(0))
    rows = [0, 1, 0, 1]  # ranks 0, 1: stage 0's replicas 0, 1; ranks 2, 3: stage 1's
    assert [tuple(cores[r]) for r in range(4)] == plan_cores(rows, machine)
    if len(machine) > 1:
        assert not set(cores[0]) & set(cores[1]) and not set(cores[2]) & set(cores[3])
    assert len(list(tb.glob("events.out.tfevents.*"))) == 1
    scalars, texts = read_events(tb)
    want = epoch_figures(read_jsonl(out / "metrics.jsonl"))
    assert {t: v for t, v in scalars.items() if not t.startswith(("train/", "wire/"))} == want
    # the codec in force on each wire of rank 0 (stage 0, replicated) when the run starts
    assert {t: v for t, v in scalars.items() if t.startswith("wire/")} == {
        f"wire/{w}/bits_per_value": [(0, 32.0)] for w in ("bwd", "fwd", "grad")}
    assert texts == {f"wire/{w}/codec": [(0, "fp32")] for w in ("bwd", "fwd", "grad")}
    assert len([t for t in want if t.startswith("bytes/")]) > 2  # links of both stages

