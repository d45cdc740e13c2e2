"""The report of `seed003-tp`: per-variant accuracy changes against fp32, tables, a figure.

A variant is (task, parallel mode, wire direction, codec, error feedback). Its change is
the mean over seeds of its final test accuracy minus the fp32 run's of the same mode
and seed; the verdicts (`seed003_tp_trends`) read only these changes and the link rows.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from approxdist.experiments import markdown as md
from approxdist.experiments import plots
from approxdist.experiments.csvio import CsvFile, Row, group, spread

NAME = "seed003-tp"
ACCURACY_COLUMNS = ("task", "parallel", "direction", "codec", "bits_per_value",
                    "error_feedback", "seed", "epochs", "test_accuracy", "test_loss",
                    "train_loss", "step_time_s", "bytes_per_step")
ACCURACY_CSV = CsvFile("accuracy.csv", ACCURACY_COLUMNS)
LINK_COLUMNS = ("task", "link", "codec", "bits_per_value", "seed", "steps", "step_time_s",
                "bytes_per_step", "test_accuracy")
LINK_CSV = CsvFile("link.csv", LINK_COLUMNS)
#: where a format sits: (parallel mode, wire direction, error feedback) -> label
PLACES: dict[tuple[str, str, int], str] = {
    ("tensor", "fwd", 0): "TP forward", ("tensor", "fwd", 1): "TP forward + EF",
    ("tensor", "bwd", 0): "TP backward", ("tensor", "bwd", 1): "TP backward + EF",
    ("pipeline", "fwd", 0): "pipeline cut forward"}
#: a change of final accuracy within this many points (as a fraction) "costs nothing"
BUDGET = 0.01
Key = tuple[str, str, str, str, int]  # task, parallel, direction, codec, error feedback
Finals = dict[Key, dict[str, Any]]
STUDIES = (
    "Bian, Li, Wang, Xing, Venkataraman: *Does Compressing Activations Help Model Parallel "
    "Training?*, MLSys 2024 (Megatron-LM, tensor and pipeline parallelism, quantisation, "
    "pruning, learned compression). Rudakov, Beznosikov, Kholodov, Gasnikov: *Activations "
    "and Gradients Compression for Model-Parallel Training*, arXiv 2401.07788, 2024 "
    "(quantisation and TopK of activations and gradients between model-parallel workers, "
    "with and without error feedback).")


def finals(rows: list[Row]) -> Finals:
    """Per variant: final accuracy over seeds, its change against fp32 (same mode and
    seed; NaN where that reference is missing), bits and bytes per step."""
    ref = {(r["task"], r["parallel"], r["seed"]): float(r["test_accuracy"]) for r in rows
           if r["direction"] == "-"}
    out: Finals = {}
    for key, mine in group(rows, "task", "parallel", "direction", "codec",
                           "error_feedback").items():
        deltas = [float(r["test_accuracy"]) - ref[(r["task"], r["parallel"], r["seed"])]
                  for r in mine if (r["task"], r["parallel"], r["seed"]) in ref]
        out[(str(key[0]), str(key[1]), str(key[2]), str(key[3]), int(key[4]))] = {
            "accuracy": spread([float(r["test_accuracy"]) for r in mine]),
            "change": spread(deltas)["mean"] if deltas else math.nan,
            "bits": float(mine[0]["bits_per_value"]),
            "bytes_per_step": spread([float(r["bytes_per_step"]) for r in mine])["mean"]}
    return out


def change(fin: Finals, task: str, place: tuple[str, str, int], codec: str) -> float:
    """The accuracy change of `codec` at `place` for `task` (NaN: not run)."""
    parallel, direction, feedback = place
    found = fin.get((task, parallel, direction, codec, feedback))
    return float(found["change"]) if found else math.nan


def codecs_of(fin: Finals, task: str) -> list[str]:
    """The lossy formats run for `task`, in run order."""
    return list(dict.fromkeys(k[3] for k in fin if k[0] == task and k[2] != "-"))


def reference(fin: Finals, task: str, parallel: str) -> dict[str, float]:
    found = fin.get((task, parallel, "-", "fp32", 0))
    return found["accuracy"] if found else spread([])


def accuracy_table(fin: Finals, task: str) -> str:
    """Per format: final accuracy and its change against fp32 at every place."""
    rows = []
    for codec in codecs_of(fin, task):
        cells = []
        for (parallel, direction, feedback) in PLACES:
            found = fin.get((task, parallel, direction, codec, feedback))
            cells.append(f"{md.pct_spread(found['accuracy'])} ({md.points(found['change'])})"
                         if found else "-")
        bits = next(v["bits"] for k, v in fin.items() if k[0] == task and k[3] == codec)
        rows.append((f"`{codec}`", f"{bits:g}", *cells))
    return md.table(("format", "bits", *PLACES.values()), rows)


def link_table(links: list[Row], fin: Finals, task: str) -> str:
    """Per forward format through the link: bytes and time per step, speed-up, accuracy."""
    mine = [r for r in links if r["task"] == task]
    base = next((float(r["step_time_s"]) for r in mine if r["codec"] == "fp32"), math.nan)
    rows = []
    for r in mine:
        step = float(r["step_time_s"])
        delta = change(fin, task, ("tensor", "fwd", 0), str(r["codec"]))
        rows.append((f"`{r['codec']}`", f"{float(r['bits_per_value']):g}",
                     f"{float(r['bytes_per_step']) / 1e6:.3f}", f"{1e3 * step:.1f}",
                     "baseline" if r["codec"] == "fp32" else f"{base / step:.2f}x",
                     "reference" if r["codec"] == "fp32" else md.points(delta)))
    return md.table(("forward wire", "bits", "MB per step (all links)", "ms per step",
                     "speed-up vs fp32", "final accuracy vs fp32 (accuracy runs)"), rows)


def plot(out: Path, fin: Finals, tasks: list[str], title: str) -> str:
    """Per task: the accuracy change of each format at each place, grouped bars (a place
    where a format did not run has no bar)."""
    fig, axes = plots.figure(len(tasks), width=7.0)
    for ax, task in zip(axes, tasks):
        codecs = codecs_of(fin, task)
        width = 0.8 / len(PLACES)
        for i, (place, label) in enumerate(PLACES.items()):
            bars = [(j + i * width, 100 * change(fin, task, place, c))
                    for j, c in enumerate(codecs)]
            bars = [(x, y) for x, y in bars if math.isfinite(y)]  # not run: no bar
            if bars:
                ax.bar([x for x, _ in bars], [y for _, y in bars], width, label=label,
                       color=f"C{i}")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(codecs))], codecs, fontsize=7)
        ax.axhline(-100 * BUDGET, color="grey", linestyle=":", linewidth=1)
        plots.label(ax, "wire format", "final test accuracy vs fp32 (points)",
                    f"{task} (dotted: -{100 * BUDGET:.0f} point)")
    plots.save(fig, out / "accuracy_change.png", title)
    return "accuracy_change.png"
