"""`seed002-async`: what asynchronous and zero-bubble pipeline schedules buy and cost (PipeDream, 2BW, ZB).

Seed 002 describes PipeDream's asynchronous 1F1B with weight stashing and PipeDream-2BW
(micro-batches, two weight versions, double-buffered updates) beside the flushed GPipe;
zero-bubble schedules (Qi et al. ICLR 2024) split each backward into I and W instead. The
accuracy task (MNIST-1D with a narrow 1-D ResNet by default, CIFAR-10 with `--data-dir`;
`experiments.task`) trains on 2 stages with 4 micro-batches under GPipe, 1F1B with a flush,
ZB-H1, ZB-H2, ZB-V (4 chunks cut by the partitioner), PipeDream and 2BW, the same epochs and
seeds each; an asynchronous schedule streams each epoch with no flush
(`pipeline.stream_state`). 1F1B and 2BW also run without momentum (`1f1b m=0`, `2bw m=0`;
not at smoke size, which runs only ZB-H1 of the zero-bubble ones).
CSV `async.csv`, one row per (schedule, seed, epoch): schedule (the label) + the accuracy
presets' epoch columns + elapsed_s, samples_per_s, weight_version_bytes (peak per stage,
";"-separated), step_s, compute_s and bubble (`seed002_async_time`). The report compares
throughput, accuracy at the same epochs, time to a target accuracy every schedule reached,
where each step went and weight memory.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from approxdist.bench.stats import median
from approxdist.config.loader import build_config
from approxdist.data import load_dataset
from approxdist.experiments import markdown as md
from approxdist.experiments import plots
from approxdist.experiments.accuracy import (
    EPOCH_COLUMNS,
    curves,
    epoch_rows,
    finals,
    noise,
    seconds,
    time_curve,
    time_to,
)
from approxdist.experiments.base import Meta, Preset, Settings
from approxdist.experiments.catalog import listing
from approxdist.experiments.csvio import CsvFile, Row, group, spread
from approxdist.experiments.runs import epochs_of, train_run
from approxdist.experiments.seed002_async_time import (
    ZERO_BUBBLE,
    memory_trends,
    step_split,
    time_table,
    versions_why,
    zero_bubble_trends,
)
from approxdist.experiments.task import task_for
from approxdist.models import build_model
from approxdist.pipeline.partition import parse_split, stage_module
from approxdist.pipeline.schedule.registry import build_async_schedule
from approxdist.pipeline.schedule.versions import gradient_delays

NAME = "seed002-async"
SCHEDULES = ("gpipe", "1f1b", *ZERO_BUBBLE, "pipedream", "2bw")
ASYNC = ("pipedream", "2bw")
SYNC = "1f1b"
MICROBATCHES = 4
#: run again without momentum (label "<schedule> m=0"): does a delayed gradient cost accuracy
#: by itself or through momentum?
NO_MOMENTUM = ("1f1b", "2bw")
COLUMNS = ("schedule", *EPOCH_COLUMNS, "elapsed_s", "samples_per_s", "weight_version_bytes",
           "step_s", "compute_s", "bubble")
ASYNC_CSV = CsvFile("async.csv", COLUMNS)


def collect(settings: Settings) -> Meta:
    """One run per (schedule, seed); write async.csv."""
    task = task_for(settings)
    rows: list[Row] = []
    seeds = settings.seed_list()
    plain = NO_MOMENTUM if settings.size != "smoke" else ()
    schedules = SCHEDULES if settings.size != "smoke" else tuple(
        s for s in SCHEDULES if s not in ZERO_BUBBLE[1:])  # the smoke test: zbh1 only
    runs = [(name, None) for name in schedules] + [(name, 0.0) for name in plain]
    for seed in seeds:
        for schedule, momentum in runs:  # schedules interleaved within each seed
            label = schedule if momentum is None else f"{schedule} m=0"
            print(f"[{NAME}] seed {seed}: {label}", flush=True)
            sections = task.sections(seed)
            sections["pipeline"].update({"schedule": schedule, "microbatches": MICROBATCHES})
            if momentum is not None:
                sections["optim"]["momentum"] = momentum
            if schedule == "zbv":  # 2 ranks hold 4 chunks: the partitioner cuts them
                sections["pipeline"]["split"] = ""
            run_dir = settings.out / "runs" / f"{label.replace(' m=0', '-m0')}-s{seed}"
            train_run(sections, run_dir)
            rows += _rows(run_dir, label, seed)
    ASYNC_CSV.write(settings.out, rows)
    return {"task": task.describe(), "seeds": seeds, "stages": 2, "microbatches": MICROBATCHES,
            "stage_param_bytes": _stage_bytes(task.sections(seeds[0])),
            "momentum": build_config(task.sections(seeds[0])).optim.momentum,
            "cores": os.cpu_count() or 0, "ranks": 2,
            "steps_per_epoch": _steps(settings.out / "runs" / f"{SYNC}-s{seeds[0]}")}


def _stage_bytes(sections: dict[str, dict[str, Any]]) -> list[int]:
    """Parameter bytes of each stage of the task's cut (one weight version per stage)."""
    cfg = build_config(sections)
    data = load_dataset(cfg.data)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    plan = parse_split(cfg.pipeline.split, len(model))
    return [sum(p.nelement() * p.element_size() for p in stage_module(model, plan, s).parameters())
            for s in range(plan.num_stages)]


def _steps(run_dir: Path) -> int:
    first = epochs_of(run_dir)[0]
    return int(first["step"])


def _rows(run_dir: Path, schedule: str, seed: int) -> list[Row]:
    rows = epoch_rows(run_dir, seed, {"schedule": schedule})
    elapsed = 0.0
    for row, rec in zip(rows, epochs_of(run_dir)):
        elapsed += float(rec["epoch_time_s"])
        stages = sorted(rec["ranks"], key=lambda r: r["stage"])
        compute, bubble = step_split(rec)
        row.update({"elapsed_s": elapsed, "samples_per_s": rec["samples_per_s"],
                    "step_s": rec["step_time_s"], "compute_s": compute, "bubble": bubble,
                    "weight_version_bytes": ";".join(
                        str(int(r.get("peak_weight_version_bytes", 0))) for r in stages)})
    return rows


# -- report ------------------------------------------------------------------------------
def _rate(rows: list[Row], schedule: str) -> float:
    """Median samples/s over the schedule's epochs (every seed), the first epoch left out
    when there are more (start-up)."""
    mine = [r for r in rows if r["schedule"] == schedule]
    later = [r for r in mine if int(r["epoch"]) > 1] or mine
    return median([float(r["samples_per_s"]) for r in later])


def _target(rows: list[Row]) -> float:
    """The highest mean test accuracy every schedule reached at some epoch."""
    best = []
    for (_,), mine in group([r for r in rows if r["schedule"] in SCHEDULES], "schedule").items():
        per_epoch = group(mine, "epoch")
        best.append(max(spread([float(r["test_accuracy"]) for r in rs])["mean"]
                        for rs in per_epoch.values()))
    return min(best)


def _versions(rows: list[Row], schedule: str) -> list[int]:
    """Peak weight-version bytes per stage (max over seeds and epochs)."""
    cells = [[int(v) for v in str(r["weight_version_bytes"]).split(";")]
             for r in rows if r["schedule"] == schedule]
    return [max(col) for col in zip(*cells)] if cells else []


def trend_rows(rows: list[Row], meta: Meta) -> list[md.Trend]:
    fin = finals(rows, "schedule")
    sync_rate = _rate(rows, SYNC)
    out: list[md.Trend] = []
    cores, ranks = int(meta.get("cores", 0)), int(meta.get("ranks", 2))
    k = int(meta.get("steps_per_epoch", 1))
    for name in ASYNC:
        if name not in fin:
            continue
        ratio = _rate(rows, name) / sync_rate
        sched = build_async_schedule(name, 2, MICROBATCHES, max(1, k))
        bubble_sync = (2 - 1) / (MICROBATCHES + 2 - 1)
        why = (f"the flush of 1F1B leaves a bubble of (P-1)/(M+P-1) = {md.pct(bubble_sync)} "
               f"per mini-batch; a stream of {k} mini-batches leaves (P-1)/(K*M+P-1) = "
               f"{md.pct(1 / (k * MICROBATCHES + 1))}")
        if name == "pipedream":
            why += (f"; PipeDream steps the optimiser after every micro-batch "
                    f"({len(sched.updates[0])} steps per epoch on each stage, {MICROBATCHES}x "
                    f"1F1B's), each a pass over the stage's weights and their gradient")
        why += versions_why(rows, name, SYNC)
        if ratio <= 1.0:
            per_mb = median([float(r["epoch_time_s"]) / (k * MICROBATCHES)
                             for r in rows if r["schedule"] == SYNC]) if k else math.nan
            why += (f"; a hypothesis for the missing gain: a micro-batch takes "
                    f"{1e3 * per_mb:.2f} ms through the whole pipeline under 1F1B (epoch time / "
                    f"micro-batches), so the stream's fixed costs per action (each forward and "
                    f"backward through a weight version, its optimiser steps) weigh as much as "
                    f"the bubble it removes; a larger model would test it")
            if cores and cores < ranks:
                why += (f"; also, {ranks} ranks share {cores} core(s): a rank idle in the "
                        f"bubble gives its core to another rank rather than wasting it")
        out.append((f"{name}: an asynchronous schedule removes the flush bubble, so it "
                    f"trains more samples per second than 1F1B with a flush",
                    f"{_rate(rows, name):.0f} samples/s vs {sync_rate:.0f} (1F1B): "
                    f"{ratio:.3f}x", ratio > 1.0, why))
    for name in ASYNC:
        if name not in fin or SYNC not in fin:
            continue
        a, s = fin[name]["test_accuracy"], fin[SYNC]["test_accuracy"]
        diff = a["mean"] - s["mean"]
        sched = build_async_schedule(name, 2, MICROBATCHES, max(1, k))
        delays = gradient_delays(sched)
        why = (f"gradient delay per stage (optimizer steps between the weights a gradient was "
               f"computed on and those it updates): "
               f"{', '.join(f'stage {r}: {d}' for r, d in sorted(delays.items()))}; "
               f"{noise(a, s)}")
        if name == "pipedream":
            why += (f"; PipeDream's update per micro-batch is SGD on batches of "
                    f"1/{MICROBATCHES} the size at the same learning rate: a different "
                    f"optimisation, not only a delayed one")
        if diff < -0.01:
            why += _early_gap(rows, name, meta)
        plain = (finals(rows, "schedule").get(f"{name} m=0"), fin.get(f"{SYNC} m=0"))
        if plain[0] is not None and plain[1] is not None:
            gap = plain[0]["test_accuracy"]["mean"] - plain[1]["test_accuracy"]["mean"]
            why += (f"; without momentum (same task, seeds and epochs): "
                    f"{md.pct(plain[0]['test_accuracy']['mean'])} vs "
                    f"{md.pct(plain[1]['test_accuracy']['mean'])} (1F1B), {md.points(gap)}")
        out.append((f"{name} reaches the accuracy of synchronous training at the same number "
                    f"of epochs (at most 1 point below)",
                    f"{md.pct(a['mean'])} vs {md.pct(s['mean'])} (1F1B): {md.points(diff)}",
                    diff >= -0.01, why))
    out += zero_bubble_trends(rows, fin, SYNC, _rate)
    stage_bytes = [int(b) for b in meta.get("stage_param_bytes", [])]
    return out + memory_trends({name: _versions(rows, name) for name in ASYNC}, stage_bytes,
                               MICROBATCHES)


def _early_gap(rows: list[Row], name: str, meta: Meta) -> str:
    """A hypothesis for a lower accuracy, with the run's own training losses as its test."""
    def mean_loss(schedule: str, epoch: int) -> float:
        return spread([float(r["train_loss"]) for r in rows
                       if r["schedule"] == schedule and int(r["epoch"]) == epoch])["mean"]

    last = max(int(r["epoch"]) for r in rows)
    first_gap = mean_loss(name, 1) - mean_loss(SYNC, 1)
    last_gap = mean_loss(name, last) - mean_loss(SYNC, last)
    lr = meta.get("task", {}).get("lr", "?")
    momentum = meta.get("momentum", "?")
    return (f"; a hypothesis: a stale gradient with momentum {momentum} at learning rate {lr} "
            f"slows or destabilises early training (if so the training-loss gap to 1F1B "
            f"shrinks over the epochs; measured: {first_gap:+.3f} after epoch 1, "
            f"{last_gap:+.3f} after epoch {last}); `approxdist train --schedule {name}` with "
            f"a lower --set optim.lr would test it")


def result_table(rows: list[Row], target: float) -> str:
    fin = finals(rows, "schedule")
    return md.table(
        ("schedule", "final test accuracy", "samples/s (median epoch)", "vs 1F1B",
         f"time to {md.pct(target)} (s)", "weight versions, peak bytes per stage"),
        [(name, md.pct_spread(fin[name]["test_accuracy"]), f"{_rate(rows, name):.0f}",
          f"{_rate(rows, name) / _rate(rows, SYNC):.3f}x",
          seconds(time_to([r for r in rows if r["schedule"] == name], target)),
          " / ".join(map(str, _versions(rows, name))))
         for name in [*SCHEDULES, *(f"{n} m=0" for n in NO_MOMENTUM)] if name in fin])


def plot(out: Path, rows: list[Row], title: str) -> str:
    fig, (by_epoch, by_time) = plots.figure(2, width=11.0)
    curves(by_epoch, rows, "schedule", "test_accuracy", reference=SYNC)
    plots.label(by_epoch, "epoch", "test accuracy (%)", "accuracy vs epoch")
    for (name,), mine in group(rows, "schedule").items():
        by_time.plot(*time_curve(mine), marker=".", label=name, linestyle="--" if name == SYNC else "-")
    plots.label(by_time, "training time (s)", "test accuracy (%)", "accuracy vs time")
    plots.save(fig, out / "async_accuracy.png", title)
    return "async_accuracy.png"


def render(out: Path, meta: Meta) -> str:
    rows = ASYNC_CSV.read(out)
    target = _target(rows)
    task: dict[str, Any] = meta.get("task", {})
    title = (f"{NAME}: {task.get('dataset', '?')}, 2 stages, {MICROBATCHES} micro-batches, "
             f"{len(meta.get('seeds', [0]))} seed(s)")
    png = plot(out, rows, title)
    return md.report(
        [f"Task: {task.get('dataset', '?')} with {task.get('model', {})}, batch "
         f"{task.get('batch_size', '?')}, {task.get('epochs', '?')} epochs, cut at block "
         f"{task.get('split', '?')}; {meta.get('steps_per_epoch', '?')} mini-batches per epoch "
         f"(one stream per epoch for the asynchronous schedules). Target accuracy: the highest "
         f"every schedule reached.", result_table(rows, target),
         "Where each schedule's step went (median epoch; compute includes a stream's optimiser "
         "steps, which a flushed schedule runs after its step):",
         time_table(rows, SCHEDULES, SYNC, _rate)],
        [md.image(png, "test accuracy vs epoch and vs training time")],
        trend_rows(rows, meta),
        "Seed 002 discusses PipeDream and PipeDream-2BW on GPUs with large models; here two "
        "CPU ranks train a small model, the stream drains at each epoch end (evaluation and "
        "checkpoints see no micro-batch in flight), and PipeDream's unit of work is one "
        "micro-batch of the mini-batch.")


PRESET = Preset(listing(NAME), files=(ASYNC_CSV,), collect=collect, render=render)
