"""`seed003-ps`: parameter server vs all-reduce, sync / async / SSP / N+b, with stragglers.

Seed 003 weighs synchronous against asynchronous updates, a parameter server against
peer-to-peer all-reduce, the staleness of asynchronous gradients, and its remedy N+b
(update once N gradients arrived, drop the b slowest). Here the accuracy task of the other
presets (MNIST-1D with a narrow 1-D ResNet, `experiments.task`; CIFAR-10 with `--data-dir`;
the digits with a small MLP at smoke size) trains with W = 3 workers under all-reduce data
parallelism, synchronous PS (1 server, and S = W sharded servers), asynchronous PS, SSP
(s = 2) and N+b (b = 1), each without a straggler, with a persistent one (the last worker
sleeps 100 ms before each step) and with random ones (each worker, each step, 100 ms with
probability 0.1), the same epochs and seeds each. A second, larger model (seed004-adaprec's
MLP, 578 KB of parameters) times all-reduce against synchronous PS with S = 1 and S = W
without stragglers (W = 3; W = 2 and 3 at full size). The report is `seed003_ps_report`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from approxdist.config.loader import build_config
from approxdist.experiments import markdown as md
from approxdist.experiments.base import Meta, Preset, Settings
from approxdist.experiments.catalog import listing
from approxdist.experiments.csvio import Row
from approxdist.experiments.runs import epochs_of, train_run
from approxdist.experiments.seed003_ps_report import (
    EPOCHS_CSV,
    MODES,
    NAME,
    NB_CUT,
    NB_POINTS,
    PS_RATIO,
    RUNS_CSV,
    SETTING_TITLES,
    STALENESS_CSV,
    plot_accuracy,
    plot_staleness,
    select,
    setting_table,
    staleness_table,
    step_table,
    target,
)
from approxdist.experiments.seed003_ps_trends import trend_rows
from approxdist.experiments.task import Task, task_for
from approxdist.train.metrics import read_jsonl
from approxdist.train.straggler import stragglers_of

Sections = dict[str, dict[str, Any]]

#: straggler settings: none; persistent (the last worker, every step); random (every worker,
#: each step with probability PROBABILITY)
SETTINGS = ("none", "persistent", "random")
PROBABILITY = 0.1
#: the MLP of seed004-adaprec (578 KB of fp32 parameters): the same modes timed with many
#: more bytes per step than the task's model moves
BIG_MODEL = {"name": "mlp", "hidden": 256, "depth": 3}
MNIST1D_WHY = ("Why this task: MNIST-1D (Greydanus 2020, generated locally) with the narrow "
               "1-D ResNet of seed002-async is far from saturated at these epochs, so update "
               "rules can differ in accuracy; its small model makes a step cheap, so a "
               "straggler's delay dominates it. The second model times bytes instead.")


def plan(settings: Settings) -> list[tuple[str, str]]:
    """(straggler setting, mode) pairs of the accuracy matrix, in run order (modes of one
    setting adjacent, so each is timed next to its baseline). Smoke: the fewest that reach
    every table and verdict of the report (what they check, not what they show)."""
    if settings.size == "smoke":
        return [("none", m) for m in ("allreduce", "sync", "sharded", "ssp")] + \
            [("persistent", m) for m in ("sync", "backup")]
    return [(s, m) for s in SETTINGS for m in MODES if m != "sharded" or s == "none"]


def sizes(settings: Settings) -> dict[str, Any]:
    """Workers, per-worker batch, epochs, straggler delay; the step-time block's worlds."""
    smoke = settings.size == "smoke"
    return {"workers": 2 if smoke else 3, "per_worker": 32 if smoke else 42,
            "epochs": settings.pick(1, 3, 10), "delay_ms": 20 if smoke else 100,
            "step_workers": settings.pick([], [3], [2, 3]),
            "big_model": not smoke}


def sections(task: Task, settings: Settings, seed: int, mode: str, setting: str,
             workers: int, model: dict[str, Any] | None = None) -> Sections:
    """The config of one run: `mode` (a key of MODES) under straggler `setting`."""
    size = sizes(settings)
    kind, servers = MODES[mode]["ps_mode"], 0
    if kind:
        servers = workers if mode == "sharded" else 1
    world = workers + servers
    delay = f"{size['delay_ms']}ms"
    straggler = {"none": [], "persistent": [f"{world - 1}:{delay}"],  # the last worker
                 "random": [f"random:{PROBABILITY}:{delay}"]}[setting]
    out: Sections = {
        "train": {"parallel": "ps" if kind else "dp", "world_size": world, "seed": seed,
                  "progress": False, "epochs": size["epochs"], "log_every": 1 if kind else 1000,
                  "stragglers": straggler},
        "data": {"dataset": task.dataset, "data_dir": task.data_dir,
                 "batch_size": size["per_worker"] * workers, **task.extra_data},
        "model": dict(model or task.model),
        "optim": {"lr": task.lr},
    }
    if kind:
        out["ps"] = {"servers": servers, "workers": workers, "mode": kind}
    return out


def collect(settings: Settings) -> Meta:
    """The accuracy matrix, then the step-time block; write the three CSVs."""
    task, size, seeds = task_for(settings), sizes(settings), settings.seed_list()
    epochs: list[Row] = []
    runs: list[Row] = []
    stale: list[Row] = []
    label = _model_label(task.model)
    matrix = [(label, setting, mode, size["workers"], None) for setting, mode in plan(settings)]
    models = [(label, None)] + ([(_model_label(BIG_MODEL), BIG_MODEL)] if size["big_model"]
                                else [])
    block = [(name, "none", mode, w, model) for name, model in models
             for w in size["step_workers"] for mode in ("allreduce", "sync", "sharded")]
    done = {run[:4] for run in matrix}  # the task's own W-worker runs time it already
    todo = matrix + [run for run in block if run[:4] not in done]
    for seed in seeds:
        for name, setting, mode, workers, model in todo:
            print(f"[{NAME}] seed {seed}: {name}, {mode}, W={workers}, straggler {setting}",
                  flush=True)
            sec = sections(task, settings, seed, mode, setting, workers, model)
            run_dir = settings.out / "runs" / _dir(name, setting, mode, workers, seed)
            summary = train_run(sec, run_dir)
            keys = {"model": name, "setting": setting, "mode": mode,
                    "servers": sec.get("ps", {}).get("servers", 0), "workers": workers,
                    "seed": seed}
            epochs += _epoch_rows(run_dir, keys)
            runs.append(_run_row(run_dir, keys, summary, sec))
            stale += [{**keys, "staleness": int(k), "count": int(v)} for k, v in
                      summary.get("ps", {}).get("staleness_histogram", {}).items()]
    EPOCHS_CSV.write(settings.out, epochs)
    RUNS_CSV.write(settings.out, runs)
    STALENESS_CSV.write(settings.out, stale)
    return {"setup": {"dataset": task.dataset, "lr": task.lr,
                      "why": MNIST1D_WHY if task.key == "mnist1d" else task.why},
            "task_model": label, "seeds": seeds,
            "cores": os.cpu_count() or 0, "workers": size["workers"],
            "batch_size": size["per_worker"] * size["workers"], "epochs": size["epochs"],
            "delay_ms": size["delay_ms"], "probability": PROBABILITY,
            "modes": {k: v["ps_mode"] for k, v in MODES.items()}}


def _model_label(model: dict[str, Any]) -> str:
    return " ".join([str(model["name"])] + [f"{k}={v}" for k, v in model.items() if k != "name"])


def _dir(model: str, setting: str, mode: str, workers: int, seed: int) -> str:
    return f"{model.replace(' ', '_').replace('=', '')}-{setting}-{mode}-w{workers}-s{seed}"


def _epoch_rows(run_dir: Path, keys: dict[str, Any]) -> list[Row]:
    """One row per epoch: accuracy, times, the bytes all links carried and the busiest
    rank's (sent + received) in the epoch."""
    rows, elapsed, before = [], 0.0, 0
    for rec in epochs_of(run_dir):
        elapsed += float(rec["epoch_time_s"])
        links = {tuple(int(r) for r in k.split("->")): int(v)
                 for k, v in rec.get("bytes_sent", {}).items()}
        ranks = {r for pair in links for r in pair}
        busiest = max((sum(v for pair, v in links.items() if r in pair) for r in ranks),
                      default=0)
        rows.append({**keys, "epoch": rec["epoch"], "test_accuracy": rec["test_accuracy"],
                     "train_loss": rec["train_loss"], "epoch_time_s": rec["epoch_time_s"],
                     "elapsed_s": elapsed, "step_time_s": rec["step_time_s"],
                     "steps": int(rec["step"]) - before, "bytes_sent": sum(links.values()),
                     "busiest_bytes": busiest})
        before = int(rec["step"])
    return rows


def _run_row(run_dir: Path, keys: dict[str, Any], summary: dict[str, Any],
             sec: Sections) -> Row:
    """Per run: final accuracy, wall time, what the server did (server 0's view), the
    largest SSP lead in the step records, and what the slowest straggler would sleep if
    it ran every step of the run (the delay schedule of `train.straggler`)."""
    ps = summary.get("ps", {})
    leads = [max(r["lead"]) for r in read_jsonl(run_dir / "metrics.jsonl")
             if r.get("kind") == "step" and r.get("lead")]
    rules = stragglers_of(build_config(sec))
    steps = int(summary["steps"])
    sleep = max((sum(rules.delay(r, s) for s in range(steps))
                 for r in range(int(sec["train"]["world_size"]))), default=0.0)
    return {**keys, "final_accuracy": summary["test_accuracy"],
            "wall_time_s": summary["wall_time_s"], "steps": steps,
            "updates": ps.get("updates", steps), "dropped": ps.get("dropped", 0),
            "max_lead": max(leads, default=0), "straggler_sleep_s": sleep,
            "straggler": ";".join(sec["train"]["stragglers"])}


# -- report ------------------------------------------------------------------------------
def render(out: Path, meta: Meta) -> str:
    epochs = EPOCHS_CSV.read(out)
    runs = RUNS_CSV.read(out)
    stale = select(STALENESS_CSV.read(out), model=meta["task_model"])
    matrix = select(epochs, model=meta["task_model"], workers=float(meta["workers"]))
    mruns = select(runs, model=meta["task_model"], workers=float(meta["workers"]))
    goal = target(matrix)
    task: dict[str, Any] = meta["setup"]
    title = (f"{NAME}: {task.get('dataset', '?')}, {meta['workers']} workers, "
             f"{len(meta.get('seeds', [0]))} seed(s)")
    setup = (f"{task.get('dataset', '?')}, model {meta['task_model']}, W = {meta['workers']} "
             f"workers, global batch {meta['batch_size']}, lr {task.get('lr', '?')}, "
             f"{meta['epochs']} epochs, seeds {meta.get('seeds')}. Persistent straggler: the "
             f"last worker sleeps {meta['delay_ms']} ms before each step; random: each "
             f"worker, each step, {meta['delay_ms']} ms with probability "
             f"{meta['probability']}. {task['why']} Target accuracy: the highest every "
             f"configuration "
             f"reached ({md.pct(goal)}). Times are training time (evaluation left out); "
             f"time per epoch is the median over epochs after the first.")
    tables = [md.section(f"Results with {SETTING_TITLES[s]}",
                         setting_table(matrix, mruns, s, goal))
              for s in SETTING_TITLES if select(matrix, setting=s)]
    return "\n\n".join([
        md.section("Setup", setup), *tables,
        md.section("Staleness of asynchronous and SSP updates",
                   "Server 0's histogram of every applied gradient (`summary.json` `ps`); "
                   "the largest lead of a push over the slowest worker from the step "
                   "records of `metrics.jsonl`.", staleness_table(stale, mruns),
                   md.image(plot_staleness(out, stale, title),
                            "staleness histograms")),
        md.section("Sync PS vs all-reduce: time per step and bytes",
                   "No straggler; median over epochs after the first and over seeds.",
                   step_table(epochs)),
        md.section("Figure", md.image(plot_accuracy(out, matrix, title),
                                      "test accuracy vs training time per straggler setting")),
        md.section("Trends of the seed", md.trends(trend_rows(epochs, runs, stale, meta))),
        md.section("Differences from the seed",
                   "Seed 003 is a lecture: it names the strategies and their pitfalls "
                   "without numbers; the figures checked are our targets that quantify them "
                   f"(under a persistent straggler N+b's time at least {NB_CUT:.0%} below "
                   f"sync PS's, within {100 * NB_POINTS:.0f} point; sync PS within "
                   f"{PS_RATIO}x of all-reduce per step; S = W servers closing half the "
                   "gap). Every rank here "
                   f"is a local process on {meta['cores']} CPU core(s), the links gloo's "
                   "loopback: a parameter server shares the cores with its workers instead "
                   "of owning a machine and a network card."),
    ])


PRESET = Preset(listing(NAME), files=(EPOCHS_CSV, RUNS_CSV, STALENESS_CSV), collect=collect, render=render)
