"""The one place a run's records go: metrics.jsonl and, when asked, TensorBoard (rank 0).

    sink = sink_for(cfg.train, run_dir, ctx.is_main)
    sink.open(start_step)      # the run starts (a resumed run: its checkpoint's step)
    sink.write({"kind": "epoch", "epoch": 1, "step": 12, ...})
    sink.close()               # the run ends, also on error

The trainer writes its step and epoch records here and so do its step hooks (AdaPrec's
decisions); each output gets every record. Only the main rank has outputs: the others
get an empty sink. A record an output cannot write (a full disk) does not stop the rank
alone: the sink keeps the first such problem in `problem`, and the trainer's next
checkpoint stops every rank with it (`train/resume.py`, `save_agreed`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from approxdist.config.schema import TrainConfig
from approxdist.train.tensorboard import TensorBoardOutput


class MetricsOutput(Protocol):
    """Somewhere records are written."""

    def open(self, start_step: int) -> None:
        """Start writing; the run starts from `start_step` (0: a fresh run)."""

    def write(self, record: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class JsonlOutput:
    """Appends each record to a JSON-lines file (RUN_DIR/metrics.jsonl)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def open(self, start_step: int) -> None:
        """A resumed run goes on after its records: those the stopped run wrote past its
        checkpoint (`start_step`), and a line cut off by a full disk, are dropped first, as
        TensorBoard's purge step hides them (every write then appends)."""
        if start_step and self.path.is_file():
            lines = self.path.read_text().splitlines(keepends=True)
            kept = [line for line in lines if _before(line, start_step)]
            if len(kept) != len(lines):
                tmp = self.path.with_name(self.path.name + ".tmp")
                tmp.write_text("".join(kept))
                os.replace(tmp, self.path)

    def write(self, record: Mapping[str, Any]) -> None:
        try:
            with self.path.open("a") as fh:
                fh.write(json.dumps(record) + "\n")
        except OSError as exc:
            exc.filename = exc.filename or str(self.path)
            raise

    def close(self) -> None:
        """Nothing held open."""


def _before(line: str, start_step: int) -> bool:
    """Whether a metrics line is a whole record of a step up to `start_step`."""
    try:
        record = json.loads(line)
    except ValueError:
        return False
    if not isinstance(record, dict) or not line.endswith("\n"):
        return False
    step = record.get("step")
    return not (isinstance(step, int) and step > start_step)


class MetricsSink:
    """Hands every record to each of its outputs."""

    def __init__(self, outputs: Sequence[MetricsOutput] = ()) -> None:
        self.outputs = list(outputs)
        #: the first write that failed, e.g. "cannot append to RUN/metrics.jsonl (...)"
        self.problem = ""

    def open(self, start_step: int) -> None:
        for out in self.outputs:
            out.open(start_step)

    def write(self, record: Mapping[str, Any]) -> None:
        for out in self.outputs:
            try:
                out.write(record)
            except OSError as exc:
                where = f" {exc.filename}" if exc.filename else ""
                self.problem = self.problem or (f"cannot write the metrics{where} "
                                                f"({exc.strerror or exc})")

    def close(self) -> None:
        """Close every output, each even when another one's close raises."""
        with contextlib.ExitStack() as stack:
            for out in self.outputs:
                stack.callback(out.close)


def sink_for(train: TrainConfig, run_dir: Path, is_main: bool) -> MetricsSink:
    """The run's sink: metrics.jsonl in `run_dir`, and TensorBoard event files in
    `train.tensorboard` when set; no outputs on ranks other than the main one."""
    if not is_main:
        return MetricsSink()
    outputs: list[MetricsOutput] = [JsonlOutput(run_dir / "metrics.jsonl")]
    if train.tensorboard:
        outputs.append(TensorBoardOutput(train.tensorboard))
    return MetricsSink(outputs)
