"""A run directory that fills up or turns read-only in the middle of training: every rank
stops after that epoch with one error line (exit 2), the last good checkpoint of every
stage stays whole and loadable (written aside, renamed only once every stage wrote its
own), and `--resume` trains on from it once the folder takes files again; a metrics file
that cannot be written stops the run the same way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from approxdist.cli.main import main
from approxdist.config.loader import build_config
from approxdist.launch.context import DistContext
from approxdist.train.build import build_trainer
from approxdist.train.checkpoint import NAME, TMP_NAME, load_checkpoint
from approxdist.train.metrics import read_jsonl
from approxdist.train.resume import AgreedError

FAST = ["--model", "mlp", "--set", "model.hidden=32", "--set", "train.progress=false"]
FAULT = Path(__file__).parents[1] / "helpers" / "disk_fault.py"
needs_dev_full = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")


def _faulty(kind: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(FAULT), kind, "train", *args], capture_output=True,
                          text=True, timeout=300)


def _stage_epochs(run_dir: Path) -> list[int]:
    return [load_checkpoint(p.parent)["epoch"] for p in sorted(run_dir.rglob(NAME))]


@pytest.mark.parametrize("kind", [
    pytest.param("full", marks=needs_dev_full),
    pytest.param("readonly", marks=pytest.mark.skipif(
        os.geteuid() == 0, reason="root writes into a read-only folder")),
])
def test_a_run_directory_that_fails_mid_run_ends_in_one_line_and_resumes(
        kind: str, tmp_path: Path) -> None:
    """A 2-stage pipeline whose stage 1 cannot write its second checkpoint: neither stage
    renames its new one, so both stay at epoch 1 and the run resumes from there."""
    out = tmp_path / "run"
    res = _faulty(f"{kind}:stage1", "--parallel", "pipeline", "--stages", "2", "--epochs", "3",
                  "--out", str(out), *FAST)
    if kind == "readonly":
        for folder in (out, out / "stage0", out / "stage1"):
            folder.chmod(0o755)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith("approxdist: error: cannot write ")
    assert (f": the run stopped after epoch 2 and its checkpoint of epoch 1 is intact; free "
            f"space or make the run directory writable, then continue with --resume {out}\n"
            ) == res.stderr[res.stderr.index(": the run stopped"):]
    assert _stage_epochs(out) == [1, 1]
    assert not list(out.rglob(TMP_NAME))
    config = (out / "config.toml").stat().st_mtime_ns

    assert main(["train", "--resume", str(out)]) == 0
    assert (out / "config.toml").stat().st_mtime_ns == config  # nothing changed: not rewritten
    assert _stage_epochs(out) == [3, 3]
    epochs = [r["epoch"] for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "epoch"]
    assert epochs == [1, 2, 3]  # epoch 2's records of the stopped run were dropped


@needs_dev_full
def test_metrics_that_cannot_be_written_stop_the_run_after_that_epoch(tmp_path: Path) -> None:
    """Rank 0's metrics.jsonl fills up (a link to /dev/full) during epoch 2: the run stops
    after it with the one error every rank would raise, its checkpoint still of epoch 1."""
    sections = {"train": {"parallel": "single", "world_size": 1, "epochs": 3,
                          "progress": False},
                "model": {"name": "mlp", "hidden": 32}}
    trainer = build_trainer(build_config(sections), DistContext(), tmp_path, False)

    def fill_up(epoch: int) -> None:
        if epoch == 1:
            (tmp_path / "metrics.jsonl").unlink()
            (tmp_path / "metrics.jsonl").symlink_to("/dev/full")

    trainer.epoch_hooks.append(fill_up)
    with pytest.raises(AgreedError) as exc:
        trainer.run()
    assert str(exc.value) == (
        f"cannot write the metrics {tmp_path / 'metrics.jsonl'} (No space left on device): the "
        f"run stopped after epoch 2 and its checkpoint of epoch 1 is intact; free space or "
        f"make the run directory writable, then continue with --resume {tmp_path}")
    assert load_checkpoint(tmp_path)["epoch"] == 1 and not (tmp_path / TMP_NAME).exists()
