"""`approxdist train --parallel ps` end to end: bad input, async convergence with a random
straggler, a straggler in data parallelism, and a killed worker or server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from approxdist.cli.main import main
from tests.helpers.killed_runs import KilledRun, run_and_kill

FAST = ["--model", "mlp", "--set", "model.hidden=32", "--set", "train.progress=false"]


@pytest.mark.parametrize(("args", "message"), [
    (["--servers", "0", "--workers", "2"], "ps.servers = 0 must be >= 1"),
    (["--servers", "1", "--workers", "0"], "ps.workers = 0 must be >= 1"),
    (["--servers", "1", "--workers", "2", "--world-size", "4"],
     "train.world_size = 4 but --servers 1 + --workers 2 make 3 ranks"),
    (["--workers", "2", "--ps-mode", "fast"], "--ps-mode 'fast' is not one of"),
    (["--workers", "2", "--ps-mode", "backup:2"], "leaves no gradient"),
    (["--workers", "2", "--straggler", "5:100ms"], "rank 5 is not in this run of 3 rank(s)"),
    (["--workers", "2", "--straggler", "random:x:1ms"], "probability 'x'"),
    (["--workers", "2", "--pull-codec", "fp7"], "wire.pull.codec = 'fp7'"),
    (["--workers", "2", "--tolerate-worker-loss"], "--ps-mode sync: every step waits"),
    (["--workers", "2", "--ps-mode", "async", "--tolerate-worker-loss", "--trace"],
     "--tolerate-worker-loss with --trace: the trace is gathered from every rank"),
    (["--workers", "2", "--staleness-lr"],  # never ignored: sync keeps staleness at 0
     "--staleness-lr divides the learning rate by a gradient's staleness, which --ps-mode "
     "sync keeps at 0; drop it or use --ps-mode async or ssp:<s>"),
    (["--workers", "2", "--codec", "adaprec:fp32,bf16", "--ps-mode", "async"],
     "AdaPrec speculates from snapshots of every rank between steps, and --ps-mode async "
     "keeps pushes in flight across steps; use --ps-mode sync"),
    (["--workers", "2", "--codec-rule", "*.bias=fp32"],
     "wire.push.rules: per-parameter codec rules are for the data-parallel gradient wire"),
    (["--workers", "2", "--fwd-codec", "bf16"],
     "--fwd-codec sets wire.fwd.codec, which --parallel ps does not use"),
])
def test_bad_ps_input_is_one_line_exit_2(args: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--parallel", "ps", *args, *FAST]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_tolerate_worker_loss_outside_ps_is_one_line_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--parallel", "dp", "--tolerate-worker-loss", *FAST]) == 2
    err = capsys.readouterr().err
    assert ("--tolerate-worker-loss sets ps.tolerate_worker_loss, which --parallel dp does not "
            "use; drop it, or use --parallel ps") in err and len(err.strip().splitlines()) == 1


def test_async_with_random_stragglers_converges(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "async"
    # no momentum: with momentum 0.9 the arrival order (load-dependent) moved this run's
    # accuracy between 46 % and 96 %. Without it 5 epochs gave 85-92 % and once 78 % in CI;
    # 8 epochs gave 92-95 % over twelve runs with three or four runs sharing the 2 cores
    # in this process (the ranks fork from the suite's fork server): no interpreter to start
    assert main(["train", "--parallel", "ps", "--servers", "1", "--workers", "2", "--ps-mode",
                 "async", "--straggler", "random:0.2:2ms", "--lr", "0.3", "--set",
                 "optim.momentum=0.0", "--epochs", "8", "--set", "train.log_every=1", "--out",
                 str(out), *FAST]) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.8 and summary["parallel"] == "ps"
    assert {"test_accuracy", "wall_time_s", "samples_per_s", "bytes_sent"} <= set(summary)
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    stale = [s for r in steps if r["kind"] == "step" for s in r["staleness"]]
    assert len(stale) == summary["ps"]["updates"] == 2 * summary["steps"]


def test_a_persistent_straggler_applies_to_data_parallelism(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dp"
    assert main(["train", "--parallel", "dp", "--world-size", "2", "--straggler", "1:1ms",
                 "--epochs", "1", "--out", str(out), *FAST]) == 0, capsys.readouterr().err
    cfg = (out / "config.toml").read_text()
    assert 'stragglers = [\n    "1:1ms",\n]' in cfg or 'stragglers = ["1:1ms"]' in cfg


KILLS = [("sync", 2, "worker 1 (rank 2)"), ("async", 0, "server 0 (rank 0)"),
         ("backup:1", 2, "worker 1 (rank 2)")]


@pytest.fixture(scope="module")
def killed_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str]]:
    """Per mode, (exit code, stderr) of a run whose victim was killed after epoch 1; the
    three runs start together (tests/helpers/killed_runs.py)."""
    root = tmp_path_factory.mktemp("killed")
    return run_and_kill({mode: KilledRun(root / mode, victim, (
        "--parallel", "ps", "--workers", "2", "--ps-mode", mode, "--epochs", "500", *FAST))
        for mode, victim, _ in KILLS})


@pytest.mark.parametrize(("mode", "victim", "name"), KILLS)
def test_a_killed_rank_ends_the_run_naming_it(killed_runs: dict[str, tuple[int, str]],
                                              mode: str, victim: int, name: str) -> None:
    code, err = killed_runs[mode]
    assert code != 0 and name in err, err
