"""`seed003-largebatch`: accuracy and time to accuracy against the global batch (seed 003).

Seed 003's large-batch problem: with data parallelism the global batch grows with the
workers and accuracy falls; linear learning-rate scaling with gradual warm-up (Goyal et
al. 2017) keeps it, and growing the batch instead of decaying the learning rate (Smith et
al. 2018) keeps the SGD noise scale g = lr / (1 - m) (N / B - 1) on the decay's path with
fewer updates. Here 2 data-parallel gloo ranks split each global batch (the optimiser
sees the global batch; the ranks are fixed because this machine has 2 cores, and the
gradient all-reduce per step is what makes a larger batch cheaper per epoch) and train a
narrow 1-D ResNet on MNIST-1D for a fixed number of epochs: a sweep of global batches,
each (a) at the base rate (`unscaled`) and (b) with `optim.scale_lr` + `warmup_epochs`
(`linear+warmup`); then (c) step decay of the rate by gamma at fixed epochs against (d)
`optim.schedule = grow`, the batch growing by 1/gamma at the same epochs.

CSV `largebatch.csv`, one row per (rule, starting global batch, seed, epoch): the accuracy
presets' epoch columns + batch_size (this epoch's global batch), lr (the epoch's last
rate), noise_scale, updates and samples_seen (cumulative), elapsed_s (training time).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from torch import nn

from approxdist.config.loader import build_config
from approxdist.config.schema import Config
from approxdist.data import TensorDataset, load_dataset
from approxdist.errors import ConfigError
from approxdist.experiments import markdown as md
from approxdist.experiments import plots
from approxdist.experiments import seed003_largebatch_report as rep
from approxdist.experiments.accuracy import epoch_rows
from approxdist.experiments.base import Meta, Preset, Settings
from approxdist.experiments.catalog import listing
from approxdist.experiments.csvio import Row
from approxdist.experiments.runs import epochs_of, train_run
from approxdist.models import build_model

NAME = "seed003-largebatch"
RANKS = 2
BASE_BATCH = 32
#: the accuracy presets' rate (0.1 at batch 64), scaled linearly to the base batch 32
BASE_LR = 0.05
WARMUP_EPOCHS = 1.0
#: the decay / growth factor per point: the rate x 0.2, or the batch x 5
GAMMA = 0.2
WHY = ("MNIST-1D (Greydanus 2020; 4000 training / 1000 test signals, generated locally) with "
       "the accuracy presets' narrow 1-D ResNet (width 4, one block per group), chosen because "
       "at the base batch it stays below saturation within 8-10 epochs while a larger batch "
       "at the same rate loses accuracy within them (the table below), so the rules have "
       "something to recover. The ResNet normalises its batches per rank (B / 2 samples), "
       "where Goyal et al. kept 32 per GPU.")
SMOKE_WHY = "Smoke size: digits with a small MLP, which checks the machinery only."


def sweep(settings: Settings) -> tuple[int, ...]:
    return tuple(settings.pick((32, 128), (32, 128, 512, 1024), (32, 64, 128, 256, 512, 1024)))


def every(settings: Settings) -> int:
    """Epochs between two decay (growth) points."""
    return int(settings.pick(1, 3, 4))


def task(settings: Settings, seed: int, batch: int) -> dict[str, dict[str, Any]]:
    """The config shared by every run; the rule's [optim] keys come on top."""
    smoke = settings.size == "smoke"
    return {
        "train": {"parallel": "dp", "world_size": RANKS, "seed": seed, "progress": False,
                  "epochs": settings.pick(2, 8, 10), "log_every": 1_000_000},
        "data": {"dataset": "digits" if smoke else "mnist1d", "batch_size": batch},
        "model": ({"name": "mlp", "hidden": 32, "depth": 2} if smoke else
                  {"name": "resnet1d", "width": 4, "depth": 1}),
        "optim": {"lr": BASE_LR, "base_batch": BASE_BATCH},
    }


def rule_keys(rule: str, settings: Settings, steps_per_epoch: int) -> dict[str, Any]:
    """The [optim] keys of each rule (the sweep's cosine decay, or the step / grow pair)."""
    keys: dict[str, dict[str, Any]] = {
        rep.UNSCALED: {"schedule": "cosine"},
        rep.SCALED: {"schedule": "cosine", "scale_lr": True, "warmup_epochs": WARMUP_EPOCHS},
        rep.DECAY: {"schedule": "step", "gamma": GAMMA,
                    "step_size": every(settings) * steps_per_epoch},
        rep.GROWTH: {"schedule": "grow", "gamma": GAMMA, "grow_every_epochs": every(settings)},
    }
    return keys[rule]


def collect(settings: Settings) -> Meta:
    """The sweep (both rules per batch, interleaved) and the decay / growth pair, per seed."""
    if settings.data_dir:
        raise ConfigError(f"{NAME} trains MNIST-1D (generated locally); --data-dir "
                          f"{settings.data_dir!r} does not apply: leave it out")
    seeds = settings.seed_list()
    cfg = build_config(task(settings, 0, BASE_BATCH))
    data = load_dataset(cfg.data)
    train_size = int(data.train_x.shape[0])
    # at the base batch the linear rule scales by 1 and ramps from lr to lr: the smoke size
    # leaves that run out to stay short
    plan = [(rule, b) for b in sweep(settings) for rule in rep.RULES
            if not (settings.size == "smoke" and rule == rep.SCALED and b == BASE_BATCH)]
    plan += [(rule, BASE_BATCH) for rule in rep.SCHEDULES]
    rows: list[Row] = []
    for seed in seeds:
        for rule, batch in plan:
            print(f"[{NAME}] seed {seed}: {rule}, global batch {batch}", flush=True)
            sections = task(settings, seed, batch)
            sections["optim"].update(rule_keys(rule, settings, train_size // batch))
            run_dir = settings.out / "runs" / f"{rule.replace('+', '-')}-b{batch}-s{seed}"
            train_run(sections, run_dir)
            rows += _rows(run_dir, rule, batch, seed)
    rep.LARGEBATCH_CSV.write(settings.out, rows)
    sec = task(settings, 0, BASE_BATCH)
    return {"seeds": seeds, "ranks": RANKS, "cores": os.cpu_count() or 0,
            "dataset": cfg.data.dataset, "model": sec["model"],
            "epochs": cfg.train.epochs, "lr": BASE_LR, "base_batch": BASE_BATCH,
            "warmup_epochs": WARMUP_EPOCHS, "momentum": cfg.optim.momentum, "gamma": GAMMA,
            "every": every(settings), "train_size": train_size,
            "test_size": int(data.test_x.shape[0]), "batch_norm": _has_batch_norm(cfg, data)}


def _has_batch_norm(cfg: Config, data: TensorDataset) -> bool:
    """Whether the task's model normalises with batch statistics (the report's hypotheses
    about evaluation name BatchNorm only then)."""
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def _rows(run_dir: Path, rule: str, batch: int, seed: int) -> list[Row]:
    rows = epoch_rows(run_dir, seed, {"rule": rule, "global_batch": batch})
    elapsed, samples, before = 0.0, 0, 0
    for row, rec in zip(rows, epochs_of(run_dir)):
        elapsed += float(rec["epoch_time_s"])
        samples += (int(rec["step"]) - before) * int(rec["batch_size"])
        before = int(rec["step"])
        row.update({"batch_size": rec["batch_size"], "lr": rec["lr"],
                    "noise_scale": rec["noise_scale"], "updates": rec["step"],
                    "samples_seen": samples, "elapsed_s": elapsed})
    return rows


# -- report ------------------------------------------------------------------------------
def plot_sweep(out: Path, rows: list[Row], title: str) -> str:
    fig, (acc, when) = plots.figure(2, width=6.0)
    goal = rep.target(rows)
    for rule in rep.RULES:
        xs = rep.batches(rows)
        stats = [rep.final(rep.runs(rows, rule, b)) for b in xs]
        plots.band(acc, xs, [100 * s["mean"] for s in stats], [100 * s["min"] for s in stats],
                   [100 * s["max"] for s in stats], rule, marker="o",
                   linestyle="--" if rule == rep.UNSCALED else "-")
        times = [(b, rep.time_to(rep.runs(rows, rule, b), goal)) for b in xs]
        reached = [(b, t) for b, t in times if math.isfinite(t)]
        when.plot([b for b, _ in reached], [t for _, t in reached], marker="o", label=rule,
                  linestyle="--" if rule == rep.UNSCALED else "-")
    acc.axhline(100 * goal, color="0.5", linewidth=0.8, linestyle=":", label="target")
    for ax in (acc, when):
        ax.set_xscale("log", base=2)
        ax.set_xticks(rep.batches(rows), [str(b) for b in rep.batches(rows)])
    when.set_ylim(bottom=0)
    plots.label(acc, "global batch (samples)", "final test accuracy (%)", "accuracy vs batch")
    plots.label(when, "global batch (samples)", "training time (s)",
                f"time to {md.pct(goal)} (missing: not reached)")
    plots.save(fig, out / "largebatch.png", title)
    return "largebatch.png"


def plot_schedules(out: Path, rows: list[Row], title: str) -> str:
    fig, axes = plots.figure(4, width=4.4)
    xkeys = (("epoch", "epoch"), ("samples_seen", "samples seen"),
             ("updates", "parameter updates"))
    for rule in rep.SCHEDULES:
        mine = rep.runs(rows, rule)
        style: dict[str, Any] = {"marker": ".", "label": rule,
                                 "linestyle": "--" if rule == rep.DECAY else "-"}
        acc = rep.by_epoch(mine, "test_accuracy")
        for ax, (key, _) in zip(axes, xkeys):
            xs = [e for e, _ in acc] if key == "epoch" else [v for _, v in rep.by_epoch(mine, key)]
            ax.plot(xs, [100 * a for _, a in acc], **style)
        g = rep.by_epoch(mine, "noise_scale")
        axes[3].plot([e for e, _ in g], [v for _, v in g], **style)
    for ax, (_, name) in zip(axes, xkeys):
        plots.label(ax, name, "test accuracy (%)", f"accuracy vs {name}")
    plots.plain_log(axes[3])
    plots.label(axes[3], "epoch", "noise scale g", "g = lr / (1 - m) (N / B - 1)")
    plots.save(fig, out / "decay_vs_growth.png", title)
    return "decay_vs_growth.png"


def render(out: Path, meta: Meta) -> str:
    rows = rep.LARGEBATCH_CSV.read(out)
    setup = rep.describe(meta)
    title = (f"{NAME}: {setup['dataset']}, {setup['ranks']} data-parallel ranks, "
             f"{setup['epochs']} epochs, {len(meta.get('seeds', [0]))} seed(s)")
    sweep_png = plot_sweep(out, rows, title)
    sched_png = plot_schedules(out, rows, title)
    return "\n\n".join([
        md.section("Result", _setup_text(setup), rep.sweep_table(rows, meta)),
        md.section("Decay vs growth", f"Both start at B = {setup['base_batch']}, lr "
                   f"{setup['lr']}; every {setup['every']} epoch(s) the decay multiplies the rate "
                   f"by {setup['gamma']}, the growth the batch by {1 / float(setup['gamma']):g}.",
                   rep.finals_table(rows), rep.schedule_table(rows)),
        md.section("Figures", md.image(sweep_png, "final accuracy and time to accuracy vs "
                                                  "global batch, per rule"),
                   md.image(sched_png, "decay vs growth: accuracy vs epoch, samples seen and "
                                       "updates; noise scale per epoch")),
        md.section("Trends of the seed", md.trends(rep.trend_rows(rows, meta))),
        md.section("The seed's and the papers' figures", rep.papers_table()),
        md.section("Differences from the seed",
                   f"The papers train ResNet-50 on ImageNet (1.28 M images) on up to 1024 GPUs; "
                   f"here {setup['ranks']} CPU ranks on {meta.get('cores', '?')} core(s) train "
                   f"a small model on {setup['train_size']} samples, so a batch of the sweep is "
                   f"a far larger share of the data than any of theirs, and only the trends are "
                   f"comparable, not the figures."),
    ])


def _setup_text(setup: dict[str, Any]) -> str:
    why = WHY if setup["dataset"] == "mnist1d" else SMOKE_WHY
    return (f"Task: {setup['dataset']} ({setup['train_size']} training / {setup['test_size']} "
            f"test samples) with {setup['model']}, {setup['ranks']} data-parallel ranks, "
            f"{setup['epochs']} epochs, SGD momentum {setup['momentum']}, base rate "
            f"{setup['lr']} at base batch {setup['base_batch']}, cosine decay; `linear+warmup`: "
            f"rate x B / {setup['base_batch']}, ramped from {setup['lr']} over "
            f"{setup['warmup_epochs']} epoch(s). Target: {100 * rep.TARGET_SHARE:.0f} % of the "
            f"reference's final accuracy (smallest batch, unscaled). {why}")


PRESET = Preset(listing(NAME), files=(rep.LARGEBATCH_CSV,), collect=collect, render=render)
