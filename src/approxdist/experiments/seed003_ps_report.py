"""The report of `seed003-ps`, from its CSVs alone: tables per straggler setting, staleness,
sync PS vs all-reduce time per step, and the seed's trends (with our targets) checked.

CSVs: `epochs.csv`, one row per (model, setting, mode, workers, seed, epoch): test_accuracy,
train_loss, epoch_time_s, elapsed_s (training time to the epoch's end), step_time_s, steps
(in the epoch), bytes_sent (all links, in the epoch) and busiest_bytes (the rank that sent
plus received the most); `runs.csv`, one row per run: final_accuracy, wall_time_s, steps,
updates and dropped (server 0), max_lead (largest SSP lead in the step records),
straggler_sleep_s (what the slowest straggler sleeps when it runs every step of the run)
and straggler (the `--straggler` specs); `staleness.csv`: server 0's staleness histogram
of every PS run (staleness, count).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from approxdist.bench.stats import median
from approxdist.experiments import markdown as md
from approxdist.experiments import plots
from approxdist.experiments.accuracy import time_curve, time_to
from approxdist.experiments.csvio import CsvFile, Row, group, spread

NAME = "seed003-ps"
#: mode key -> label and `--ps-mode` ("" for all-reduce data parallelism)
MODES: dict[str, dict[str, str]] = {
    "allreduce": {"label": "all-reduce (DP)", "ps_mode": ""},
    "sync": {"label": "sync PS", "ps_mode": "sync"},
    "sharded": {"label": "sync PS, S = W", "ps_mode": "sync"},
    "async": {"label": "async PS", "ps_mode": "async"},
    "ssp": {"label": "SSP, s = 2", "ps_mode": "ssp:2"},
    "backup": {"label": "N+b, b = 1", "ps_mode": "backup:1"},
}
SSP_BOUND = 2
KEYS = ("model", "setting", "mode", "servers", "workers", "seed")
EPOCH_COLUMNS = (*KEYS, "epoch", "test_accuracy", "train_loss", "epoch_time_s", "elapsed_s",
                 "step_time_s", "steps", "bytes_sent", "busiest_bytes")
EPOCHS_CSV = CsvFile("epochs.csv", EPOCH_COLUMNS)
RUN_COLUMNS = (*KEYS, "final_accuracy", "wall_time_s", "steps", "updates", "dropped",
               "max_lead", "straggler_sleep_s", "straggler")
RUNS_CSV = CsvFile("runs.csv", RUN_COLUMNS)
STALENESS_COLUMNS = (*KEYS, "staleness", "count")
STALENESS_CSV = CsvFile("staleness.csv", STALENESS_COLUMNS)
SETTING_TITLES = {"none": "no straggler", "persistent": "a persistent straggler",
                  "random": "random stragglers"}
#: our targets that quantify seed 003's claims (the lecture gives no numbers)
NB_CUT, NB_POINTS, PS_RATIO = 0.5, 0.01, 1.5


def select(rows: list[Row], **keys: Any) -> list[Row]:
    return [r for r in rows if all(r[k] == v for k, v in keys.items())]


def later(rows: list[Row]) -> list[Row]:
    """Epochs after the first (start-up) when there are more."""
    return [r for r in rows if int(r["epoch"]) > 1] or rows


def med(rows: list[Row], key: str) -> float:
    return median([float(r[key]) for r in later(rows)])


def mean(rows: list[Row], key: str) -> float:
    return spread([float(r[key]) for r in rows])["mean"]


def target(matrix: list[Row]) -> float:
    """The highest mean test accuracy every (setting, mode) of the matrix reached."""
    best = [max(spread([float(r["test_accuracy"]) for r in rs])["mean"]
                for rs in group(mine, "epoch").values())
            for mine in group(matrix, "setting", "mode").values()]
    return min(best) if best else math.nan


def _s(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "not reached"


def _mb(value: float) -> str:
    return f"{value / 1e6:.2f}" if math.isfinite(value) else "n/a"


def setting_table(matrix: list[Row], runs: list[Row], setting: str, goal: float) -> str:
    base = select(matrix, setting=setting, mode="sync")
    lines = []
    for mode, spec in MODES.items():
        mine = select(matrix, setting=setting, mode=mode)
        if not mine:
            continue
        ratio = med(mine, "epoch_time_s") / med(base, "epoch_time_s") if base else math.nan
        fin = spread([float(r["final_accuracy"]) for r in select(runs, setting=setting, mode=mode)])
        lines.append((spec["label"], _s(med(mine, "epoch_time_s")), _s(ratio, 3) + "x",
                      _s(time_to(mine, goal), 1), md.pct_spread(fin),
                      _mb(med(mine, "bytes_sent")),
                      f"{mean(select(runs, setting=setting, mode=mode), 'dropped'):.0f}"))
    return md.table(("mode", "time per epoch (s, median)", "vs sync PS",
                     f"time to {md.pct(goal)} (s)", "final test accuracy",
                     "MB per epoch (all links)", "gradients dropped"), lines)


def histogram(stale: list[Row], setting: str, mode: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for r in select(stale, setting=setting, mode=mode):
        out[int(r["staleness"])] = out.get(int(r["staleness"]), 0) + int(r["count"])
    return dict(sorted(out.items()))


def hist_mean(h: dict[int, int]) -> float:
    n = sum(h.values())
    return sum(k * v for k, v in h.items()) / n if n else math.nan


def staleness_table(stale: list[Row], runs: list[Row]) -> str:
    """Histogram, mean staleness and largest lead of async and SSP (one model's rows)."""
    lines = []
    for setting, mode in group(stale, "setting", "mode"):
        if mode not in ("async", "ssp"):
            continue
        h = histogram(stale, setting, mode)
        lead = max(int(r["max_lead"]) for r in select(runs, setting=setting, mode=mode))
        lines.append((MODES[mode]["label"], SETTING_TITLES[setting],
                      ", ".join(f"{k}: {v}" for k, v in h.items()), f"{hist_mean(h):.2f}",
                      str(lead)))
    return md.table(("mode", "straggler", "staleness: gradients (server 0, all seeds)",
                     "mean staleness", "largest lead"), lines)


def step_rows(epochs: list[Row]) -> list[tuple[str, int, dict[str, dict[str, float]]]]:
    """Per (model, workers) of the no-straggler runs: per mode of all-reduce / sync / sharded,
    the median time per step (s), its paired ratio to all-reduce (`vs`: the median over seeds
    of the ratio within each seed, whose runs ran next to each other) and the bytes per step
    (all links, busiest rank)."""
    out = []
    for (model, workers), mine in group(select(epochs, setting="none"), "model", "workers").items():
        cells = {}
        base = {s: med(rs, "step_time_s")
                for (s,), rs in group(select(mine, mode="allreduce"), "seed").items()}
        for mode in ("allreduce", "sync", "sharded"):
            rs = later(select(mine, mode=mode))
            if rs:
                steps = median([float(r["steps"]) for r in rs])
                paired = [med(seed_rows, "step_time_s") / base[s]
                          for (s,), seed_rows in group(rs, "seed").items() if s in base]
                cells[mode] = {"step_s": med(rs, "step_time_s"), "vs": median(paired),
                               "vs_min": min(paired, default=math.nan),
                               "vs_max": max(paired, default=math.nan),
                               "bytes": med(rs, "bytes_sent") / steps,
                               "busiest": med(rs, "busiest_bytes") / steps,
                               "servers": float(rs[0]["servers"])}
        out.append((str(model), int(workers), cells))
    return out


def step_table(epochs: list[Row]) -> str:
    lines = []
    for model, workers, cells in step_rows(epochs):
        for mode, c in cells.items():
            lines.append((model, workers, MODES[mode]["label"], int(c["servers"]),
                          f"{1e3 * c['step_s']:.2f}", f"{c['vs']:.2f}x",
                          f"{c['bytes'] / 1e3:.1f}", f"{c['busiest'] / 1e3:.1f}"))
    return md.table(("model", "workers W", "mode", "servers S", "time per step (ms, median)",
                     "vs all-reduce (paired)", "kB per step, all links",
                     "kB per step, busiest rank"), lines)


def plot_accuracy(out: Path, matrix: list[Row], title: str) -> str:
    settings = [s for s in SETTING_TITLES if select(matrix, setting=s)]
    fig, axes = plots.figure(len(settings), width=5.5)
    for ax, setting in zip(axes, settings):
        for i, (mode, spec) in enumerate(MODES.items()):
            mine = select(matrix, setting=setting, mode=mode)
            if not mine:
                continue
            ax.plot(*time_curve(mine), marker=".", label=spec["label"],
                    linestyle="--" if mode == "sync" else "-",
                    color=f"C{i}")  # one colour per mode in every panel
        plots.label(ax, "training time (s)", "test accuracy (%)", SETTING_TITLES[setting])
    plots.save(fig, out / "ps_accuracy_vs_time.png", title)
    return "ps_accuracy_vs_time.png"


def plot_staleness(out: Path, stale: list[Row], title: str) -> str:
    settings = [s for s in SETTING_TITLES if select(stale, setting=s)]
    fig, axes = plots.figure(max(1, len(settings)), width=5.0)
    for ax, setting in zip(axes, settings):
        for i, mode in enumerate(("async", "ssp")):
            h = histogram(stale, setting, mode)
            n = sum(h.values())
            if n:
                ax.bar([k + 0.4 * i - 0.2 for k in h], [100 * v / n for v in h.values()],
                       width=0.4, label=MODES[mode]["label"], color=f"C{i + 3}")
        plots.label(ax, "staleness (updates between read and use)", "gradients (%)",
                    SETTING_TITLES[setting])
    plots.save(fig, out / "ps_staleness.png", title)
    return "ps_staleness.png"
