"""The one place a run's records go: metrics.jsonl and, when asked, TensorBoard (rank 0).

    sink = sink_for(cfg.train, run_dir, ctx.is_main)
    sink.open(start_step)      # the run starts (a resumed run: its checkpoint's step)
    sink.write({"kind": "epoch", "epoch": 1, "step": 12, ...})
    sink.close()               # the run ends, also on error

The trainer writes its step and epoch records here and so do its step hooks (AdaPrec's
decisions); each output gets every record. Only the main rank has outputs: the others
get an empty sink.
"""

from __future__ import annotations

import contextlib
import json
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
        """Nothing to do: every write appends (a resumed run goes on after its records)."""

    def write(self, record: Mapping[str, Any]) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Nothing held open."""


class MetricsSink:
    """Hands every record to each of its outputs."""

    def __init__(self, outputs: Sequence[MetricsOutput] = ()) -> None:
        self.outputs = list(outputs)

    def open(self, start_step: int) -> None:
        for out in self.outputs:
            out.open(start_step)

    def write(self, record: Mapping[str, Any]) -> None:
        for out in self.outputs:
            out.write(record)

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
