"""Reading TensorBoard event files back for the tests, with TensorBoard's own reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from approxdist.train.tensorboard import EPOCH_TAGS


def read_events(log_dir: Path) -> tuple[dict[str, list[tuple[int, float]]],
                                         dict[str, list[tuple[int, str]]]]:
    """(scalars, texts) in `log_dir`: per tag, its (step, value) in order, as TensorBoard
    shows them (events an earlier run left past a restart's purge step hidden); a tag
    with no events left is left out."""
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
               for tag in acc.Tags()["scalars"]}
    texts = {tag.removesuffix("/text_summary"):
             [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]
             for tag in acc.Tags()["tensors"] if tag.endswith("/text_summary")}
    # a tag whose every event was purged is still listed, with no events
    return ({k: v for k, v in scalars.items() if v}, {k: v for k, v in texts.items() if v})


def epoch_figures(records: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """The epoch tags TensorBoard should show for `records` of metrics.jsonl (float32)."""
    epochs = [r for r in records if r.get("kind") == "epoch"]
    out = {tag: [(r["step"], _f32(r[key])) for r in epochs] for key, tag in EPOCH_TAGS.items()}
    for link in sorted({link for r in epochs for link in r["bytes_sent"]}):
        out[f"bytes/{link}"] = [(r["step"], _f32(r["bytes_sent"][link])) for r in epochs
                                if link in r["bytes_sent"]]
    out["bytes/total"] = [(r["step"], _f32(sum(r["bytes_sent"].values()))) for r in epochs]
    return out


def _f32(x: float) -> float:
    return float(np.float32(x))
