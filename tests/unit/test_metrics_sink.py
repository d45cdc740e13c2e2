"""The metrics sink: metrics.jsonl and TensorBoard event files get the same records.

The event files are read back with TensorBoard's own reader (`EventAccumulator`): each
tag's steps and values must be the records' (as float32, TensorBoard's scalar type).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from approxdist.config.schema import TrainConfig
from approxdist.errors import ConfigError
from approxdist.train.sink import JsonlOutput, MetricsSink, sink_for
from approxdist.train.tensorboard import (
    EPOCH_TAGS,
    STEP_TAGS,
    TensorBoardOutput,
    check_log_dir,
    codec_bits,
    tensorboard_entries,
)
from tests.helpers.tensorboard import read_events


def _f32(x: float) -> float:
    return float(np.float32(x))


def _step(step: int, loss: float) -> dict[str, Any]:
    return {"kind": "step", "epoch": 1 + (step - 1) // 20, "step": step, "loss": loss,
            "lr": 0.1 / step, "versions": [1, 2]}


def _epoch(epoch: int, step: int) -> dict[str, Any]:
    return {"kind": "epoch", "epoch": epoch, "step": step, "train_loss": 1.5 / epoch,
            "train_accuracy": 0.5 + epoch / 10, "test_accuracy": 0.45 + epoch / 10,
            "test_loss": 1.7 / epoch, "samples_per_s": 1234.5 * epoch, "step_time_s": 0.0125,
            "epoch_time_s": 0.25, "time_compute_s": 0.1, "time_comm_s": 0.07,
            "time_wait_s": 0.03, "bytes_sent": {"0->1": 4096 * epoch, "1->0": 1024},
            "ranks": [{"rank": 0, "stage": 0, "replica": 0}], "batch_size": 64,
            "lr": 0.05, "noise_scale": 21.5}


ADAPREC = [
    {"kind": "adaprec", "epoch": 1, "step": 0, "chosen": "fp32", "reason": "first phase"},
    {"kind": "adaprec", "epoch": 1, "step": 10, "signal": 0.62, "chosen": "fp8-e5m2",
     "reason": "best predicted gain", "candidates": {"fp32": {}, "fp8-e5m2": {}}},
    {"kind": "adaprec", "epoch": 2, "step": 30, "signal": 0.31, "rolled_back": "fp8-e5m2",
     "chosen": "policy:seed004", "reason": "best predicted gain"},
]


def test_the_event_files_hold_what_metrics_jsonl_holds(tmp_path: Path) -> None:
    records = [ADAPREC[0], _step(5, 2.0), ADAPREC[1], _step(10, 1.5), _step(15, 1.25),
               _step(20, 1.0), _epoch(1, 20), ADAPREC[2], _step(40, 0.5), _epoch(2, 40)]
    sink = sink_for(TrainConfig(tensorboard=str(tmp_path / "tb")), tmp_path, is_main=True)
    sink.open(0)
    for r in records:
        sink.write(r)
    sink.close()

    assert [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()] \
        == records
    scalars, texts = read_events(tmp_path / "tb")
    steps = [r for r in records if r["kind"] == "step"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    want: dict[str, list[tuple[int, float]]] = {
        **{tag: [(r["step"], _f32(r[key])) for r in steps] for key, tag in STEP_TAGS.items()},
        **{tag: [(r["step"], _f32(r[key])) for r in epochs] for key, tag in EPOCH_TAGS.items()},
        "bytes/0->1": [(20, 4096.0), (40, 8192.0)], "bytes/1->0": [(20, 1024.0), (40, 1024.0)],
        "bytes/total": [(20, 5120.0), (40, 9216.0)],
        "wire/grad/bits_per_value": [(0, 32.0), (10, 8.0)],  # a policy has no one codec
        "adaprec/signal": [(10, _f32(0.62)), (30, _f32(0.31))],
    }
    assert scalars == want
    assert EPOCH_TAGS["test_accuracy"] == "test/accuracy"  # the documented names
    assert texts == {"wire/grad/codec": [
        (0, "fp32 (first phase)"), (10, "fp8-e5m2 (best predicted gain)"),
        (30, "policy:seed004 (best predicted gain; the phase in fp8-e5m2 undone)")]}


def test_a_resumed_run_continues_from_its_checkpoint_and_a_fresh_one_replaces(
        tmp_path: Path) -> None:
    """A run stopped after writing steps past its checkpoint (at step 20): the resumed
    run's events replace those (TensorBoard's purge step); a fresh run hides them all."""
    tb = tmp_path / "tb"
    first = TensorBoardOutput(tb)
    first.open(0)
    for r in (_step(10, 3.0), _step(20, 2.0), _epoch(1, 20), _step(30, 9.0)):  # 30: lost
        first.write(r)
    first.close()
    resumed = TensorBoardOutput(tb)
    resumed.open(20)
    for r in (_step(30, 1.0), _step(40, 0.5), _epoch(2, 40)):
        resumed.write(r)
    resumed.close()
    scalars, _ = read_events(tb)
    assert scalars["train/loss"] == [(10, 3.0), (20, 2.0), (30, 1.0), (40, 0.5)]
    assert scalars["test/accuracy"] == [(20, _f32(0.55)), (40, _f32(0.65))]

    fresh = TensorBoardOutput(tb)
    fresh.open(0)
    fresh.write(_step(10, 7.0))
    fresh.close()
    scalars, _ = read_events(tb)
    assert scalars == {"train/loss": [(10, 7.0)], "train/lr": [(10, _f32(0.01))]}


def test_only_the_main_rank_writes_and_close_closes_every_output(tmp_path: Path) -> None:
    assert sink_for(TrainConfig(tensorboard=str(tmp_path)), tmp_path, is_main=False).outputs == []
    closed: list[str] = []

    class Failing(JsonlOutput):
        def close(self) -> None:
            closed.append("failing")
            raise OSError("disk gone")

    class Counted(JsonlOutput):
        def close(self) -> None:
            closed.append("counted")

    sink = MetricsSink([Failing(tmp_path / "a"), Counted(tmp_path / "b")])
    with pytest.raises(OSError, match="disk gone"):
        sink.close()
    assert sorted(closed) == ["counted", "failing"]


def test_entries_leave_out_what_a_record_lacks() -> None:
    # a pipeline step whose loss no rank computed; records of other kinds
    assert [e.tag for e in tensorboard_entries({"kind": "step", "step": 3, "loss": None,
                                                "lr": 0.1})] == ["train/lr"]
    assert tensorboard_entries({"kind": "other", "step": 3, "x": 1.0}) == []
    assert codec_bits("table4") == 4 and codec_bits("bits:s0e2+2m0") == 4
    assert codec_bits("policy:fastest") is None


def test_an_unwritable_folder_is_one_error_naming_it(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(ConfigError, match=r"train.tensorboard = '.*afile/tb': cannot make or "
                                          r"write that folder: .*; pass a folder you can write"):
        check_log_dir(str(afile / "tb"))
    check_log_dir(str(tmp_path / "new" / "tb"))  # made, writable
    assert (tmp_path / "new" / "tb").is_dir() and not any((tmp_path / "new" / "tb").iterdir())
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # not installed
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        check_log_dir(str(tmp_path / "tb"))


def test_a_check_only_sees_that_the_folder_could_be_made(tmp_path: Path) -> None:
    """`train --check` writes nothing: the folder is not made, a file in the way is one error."""
    check_log_dir(str(tmp_path / "new" / "tb"), make=False)
    assert not (tmp_path / "new").exists()
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(ConfigError, match=r"train.tensorboard = '.*afile/tb': '.*afile' is a "
                                          r"file, not a folder"):
        check_log_dir(str(afile / "tb"), make=False)
