"""Shared pieces of the accuracy presets (seed 000 Figs. 2-4): epoch rows, spreads, curves.

Every accuracy preset trains one configuration per (variant, seed) and keeps one CSV
row per epoch; the report takes the last epoch's mean and sample standard deviation
over seeds, and plots the per-epoch mean with a min-max band.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from matplotlib.ticker import MaxNLocator

from approxdist.experiments import plots
from approxdist.experiments.csvio import Row, group, spread
from approxdist.experiments.runs import epochs_of

#: the per-epoch columns every accuracy CSV carries after its own key columns
EPOCH_COLUMNS = ("seed", "epoch", "train_accuracy", "test_accuracy", "train_loss", "test_loss",
                 "epoch_time_s", "bytes_fwd")
Stats = dict[str, dict[str, float]]


def epoch_rows(run_dir: Path, seed: int, keys: Mapping[str, Any]) -> list[Row]:
    """One row per epoch of a finished run: `keys` (the variant) + EPOCH_COLUMNS."""
    rows = []
    for rec in epochs_of(run_dir):
        rows.append({**keys, "seed": seed, "epoch": rec["epoch"],
                     "train_accuracy": rec["train_accuracy"],
                     "test_accuracy": rec["test_accuracy"], "train_loss": rec["train_loss"],
                     "test_loss": rec["test_loss"], "epoch_time_s": rec["epoch_time_s"],
                     "bytes_fwd": rec["bytes_sent"].get("0->1", 0)})
    return rows


def finals(rows: list[Row], key: str) -> dict[Any, Stats]:
    """Per value of `key`: spread over seeds of the last epoch's accuracies and forward bytes.

    A diverged run (NaN accuracy never happens, but NaN loss does) counts as it scored.
    """
    last = max(r["epoch"] for r in rows)
    out: dict[Any, Stats] = {}
    for (value,), rs in group([r for r in rows if r["epoch"] == last], key).items():
        out[value] = {k: spread([float(r[k]) for r in rs])
                      for k in ("train_accuracy", "test_accuracy", "bytes_fwd")}
    return out


def curves(ax: plots.Axes, rows: list[Row], key: str, metric: str,
           label: Any = str, reference: Any = None) -> None:
    """Per value of `key`: mean of `metric` (in %) per epoch over seeds, min-max band."""
    for (value,), rs in group(rows, key).items():
        by_epoch = group(rs, "epoch")
        epochs = sorted(by_epoch)
        stats = [spread(plots.finite([100 * float(r[metric]) for r in by_epoch[e]]))
                 for e in epochs]
        plots.band(ax, [int(e[0]) for e in epochs], [s["mean"] for s in stats],
                   [s["min"] for s in stats], [s["max"] for s in stats], label(value),
                   linestyle="--" if value == reference else "-", marker=".")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def time_curve(rows: list[Row]) -> tuple[list[float], list[float]]:
    """Accuracy against time: per epoch, in order, the mean over seeds of the training time
    to its end (`elapsed_s`) and of its test accuracy (in %)."""
    per_epoch = group(rows, "epoch")
    epochs = sorted(per_epoch, key=lambda e: int(e[0]))
    return ([spread([float(r["elapsed_s"]) for r in per_epoch[e]])["mean"] for e in epochs],
            [100 * spread([float(r["test_accuracy"]) for r in per_epoch[e]])["mean"]
             for e in epochs])


def time_to(rows: list[Row], target: float,
            combine: Callable[[list[float]], float] = statistics.fmean) -> float:
    """The training time (`elapsed_s`) until the first epoch whose test accuracy is at or
    above `target`, combined over seeds (mean unless told); NaN when a seed never reached it."""
    times = []
    for (_,), mine in group(rows, "seed").items():
        hit = [float(r["elapsed_s"]) for r in sorted(mine, key=lambda r: int(r["epoch"]))
               if float(r["test_accuracy"]) >= target]
        times.append(hit[0] if hit else math.nan)
    return combine(times) if times and all(map(math.isfinite, times)) else math.nan


def seconds(value: float) -> str:
    """A time to accuracy for a table: '12.3', or 'not reached' for NaN."""
    return f"{value:.1f}" if math.isfinite(value) else "not reached"


def noise(a: dict[str, float], b: dict[str, float]) -> str:
    """Whether the difference of two means is beyond the seed-to-seed spread, in words."""
    if a["n"] < 2 or b["n"] < 2:
        return "one seed only: no spread measured (run without --quick for >= 3 seeds)"
    diff, both = abs(a["mean"] - b["mean"]), math.hypot(a["std"], b["std"])
    word = "beyond" if diff > 2 * both else "within"
    return f"difference {100 * diff:.1f} pts, {word} 2x the combined std ({100 * both:.1f} pts)"
