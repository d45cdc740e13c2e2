"""TensorBoard event files of a run: its metrics.jsonl records as scalars and text.

`tensorboard_entries(record)` is the pure mapping from one record of metrics.jsonl to the
entries TensorBoard shows, with the global step (the steps done when the figure was
taken, the record's `step`) as x; `TensorBoardOutput` writes them with TensorBoard's own
writer (`torch.utils.tensorboard.SummaryWriter`) on rank 0 (`train/sink.py`). The same
figure has the same tag in every parallel mode (docs/training.md, TensorBoard):

    step records     train/loss, train/lr
    epoch records    epoch/train_loss, epoch/train_accuracy, test/accuracy, test/loss,
                     perf/samples_per_s, perf/step_time_s, time/compute_s, time/comm_s,
                     time/wait_s, bytes/<i->j> (each directed link), bytes/total,
                     epoch/batch_size, epoch/noise_scale
    wires            wire/<name>/codec (text), wire/<name>/bits_per_value: the codec in
                     force on each wire of the mode (grad, fwd, bwd, push, pull) when the
                     run starts, and on an AdaPrec wire at each of its decisions (the
                     text says why; bits only for a codec spec, not a policy)
    AdaPrec          adaprec/signal

A resumed run appends to the same folder from its checkpoint's step: TensorBoard's
`purge_step` hides what the stopped run wrote past it; a fresh run hides every event an
earlier run left in the folder.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from approxdist.adaptive.candidates import codec_bits
from approxdist.errors import ConfigError
from approxdist.train.run_dir import check_can_make

#: step record key -> tag
STEP_TAGS = {"loss": "train/loss", "lr": "train/lr"}
#: epoch record key -> tag
EPOCH_TAGS = {
    "train_loss": "epoch/train_loss", "train_accuracy": "epoch/train_accuracy",
    "test_accuracy": "test/accuracy", "test_loss": "test/loss",
    "samples_per_s": "perf/samples_per_s", "step_time_s": "perf/step_time_s",
    "time_compute_s": "time/compute_s", "time_comm_s": "time/comm_s",
    "time_wait_s": "time/wait_s", "batch_size": "epoch/batch_size",
    "noise_scale": "epoch/noise_scale",
}
BYTES_TOTAL = "bytes/total"
#: a wire's codec (text) and its bits per value; AdaPrec's signal
CODEC_TEXT = "wire/{}/codec"
CODEC_BITS = "wire/{}/bits_per_value"
ADAPREC_SIGNAL = "adaprec/signal"


@dataclass(frozen=True)
class Entry:
    """One TensorBoard entry: a scalar (float value) or a text (str value) at `step`."""

    tag: str
    step: int
    value: float | str


def tensorboard_entries(record: Mapping[str, Any]) -> list[Entry]:
    """What TensorBoard shows of one metrics.jsonl record (none for other kinds)."""
    kind, step = record.get("kind"), int(record.get("step", 0))
    if kind == "step":
        return _scalars(record, STEP_TAGS, step)
    if kind == "epoch":
        sent = record.get("bytes_sent", {})
        return [*_scalars(record, EPOCH_TAGS, step),
                *(Entry(f"bytes/{link}", step, float(n)) for link, n in sorted(sent.items())),
                Entry(BYTES_TOTAL, step, float(sum(sent.values())))]
    if kind == "adaprec":
        return _adaprec(record, step)
    if kind == "wires":
        return [e for name, codec in sorted(record["wires"].items())
                for e in _codec(name, str(codec), str(codec), step)]
    return []


def _scalars(record: Mapping[str, Any], tags: Mapping[str, str], step: int) -> list[Entry]:
    return [Entry(tag, step, float(record[key])) for key, tag in tags.items()
            if isinstance(record.get(key), (int, float))]


def _adaprec(record: Mapping[str, Any], step: int) -> list[Entry]:
    """An AdaPrec boundary: the codec it put on its gradient wire, as text and bits."""
    chosen = str(record["chosen"])
    why = record.get("reason", "")
    if "rolled_back" in record:
        why = f"{why}; the phase in {record['rolled_back']} undone"
    out = _codec(str(record.get("wire", "grad")), chosen,
                 f"{chosen} ({why})" if why else chosen, step)
    if isinstance(record.get("signal"), (int, float)):
        out.append(Entry(ADAPREC_SIGNAL, step, float(record["signal"])))
    return out


def _codec(wire: str, codec: str, text: str, step: int) -> list[Entry]:
    """Wire `wire`'s codec as text, and its bits per value where it is a codec spec."""
    out = [Entry(CODEC_TEXT.format(wire), step, text)]
    bits = codec_bits(codec)
    if bits is not None:
        out.append(Entry(CODEC_BITS.format(wire), step, bits))
    return out


class TensorBoardOutput:
    """Writes records into TensorBoard event files in `log_dir` (opened by `open`)."""

    def __init__(self, log_dir: str | Path) -> None:
        self.log_dir = Path(log_dir)
        self._writer: Any = None

    def open(self, start_step: int) -> None:
        """Start writing; `start_step`: the step the run starts from (0: a fresh run)."""
        # purge_step: TensorBoard hides the events before this START marker whose step is
        # >= it: all of them for a fresh run, those past the checkpoint for a resumed one
        purge = start_step + 1 if start_step else 0
        check_log_dir(str(self.log_dir))  # also where no preflight ran (torchrun)
        self._writer = summary_writer()(log_dir=str(self.log_dir), purge_step=purge)

    def write(self, record: Mapping[str, Any]) -> None:
        writer = self._writer
        assert writer is not None, "open() first"
        for e in tensorboard_entries(record):
            if isinstance(e.value, str):
                writer.add_text(e.tag, e.value, e.step)
            else:
                writer.add_scalar(e.tag, e.value, e.step)
        if record.get("kind") == "epoch":  # an epoch's figures show while the run goes on
            writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def summary_writer() -> Any:
    """TensorBoard's `SummaryWriter` class; a missing package is one line saying what to do."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("train.tensorboard needs the tensorboard package: pip install "
                          "tensorboard (or leave --tensorboard out)") from None
    return SummaryWriter


def check_log_dir(value: str, make: bool = True) -> None:
    """`train.tensorboard = value` is usable: TensorBoard is installed and the folder can be
    made and written (it is made here, unless `make` is false: `train --check` writes
    nothing); else one line naming the value and a fix."""
    summary_writer()
    path = Path(value)
    if not make:
        check_can_make(path, "train.tensorboard =")
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        where = f" ({exc.filename})" if exc.filename and os.fspath(exc.filename) != value else ""
        raise ConfigError(f"train.tensorboard = {value!r}: cannot make or write that folder: "
                          f"{reason}{where}; pass a folder you can write, e.g. "
                          f"--tensorboard runs/tb") from None
