"""`compressors`: time to accuracy and final accuracy of every gradient compressor against
fp32, bf16 and the 4-bit bit-field with error feedback, behind emulated links.

Two data-parallel gloo ranks train each task once per (link, wire, seed), the wire on the
gradient all-reduce (`--codec`, docs/compressors.md): `fp32`, `bf16`, the signed data-aware
4-bit field `bits:auto4` with error feedback (seed 000's `bits:s0e2+2m0` drops the sign, which a
gradient needs), `powersgd:2`, `topk:0.01`, `randomk:0.01`, `qsgd:7` (4 bits a value),
`terngrad`, `sign+ef` and `signsgd`. A compressor leaves the model's vectors (biases,
LayerNorm) in fp32, as torch's `powerSGD_hook` does. Tasks: the unsaturated image task
(an MLP on MNIST-1D, as `seed004-adaprec`; the digits at smoke size) and gpt-tiny on
`stdlib-text` (byte-level language modelling; next-byte accuracy). Links: 100 Mbit/s and
1 Gbit/s, emulated in-process (`comm.netem`), so the time a wire saves is real wall time.

CSVs: `runs.csv`, one row per run: task, link, wire, seed, final_accuracy, final_loss,
wall_time_s (training time, every epoch), bytes_sent (all ranks, whole run), lr;
`curves.csv`, one row per (run, epoch): task, link, wire, seed, epoch, elapsed_s (training
time to the epoch's end), test_accuracy. The report is `compressors_report.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from approxdist.experiments.base import Meta, Preset, Settings
from approxdist.experiments.catalog import listing
from approxdist.experiments.compressors_report import report
from approxdist.experiments.csvio import CsvFile, Row
from approxdist.experiments.runs import epochs_of, train_run
from approxdist.experiments.seed004_adaprec import task as adaprec_task
from approxdist.experiments.transformer_wire import Run as TextRun

NAME = "compressors"
COLUMNS = ("task", "link", "wire", "seed", "final_accuracy", "final_loss", "wall_time_s",
           "bytes_sent", "lr")
RUNS_CSV = CsvFile("runs.csv", COLUMNS)
CURVE_COLUMNS = ("task", "link", "wire", "seed", "epoch", "elapsed_s", "test_accuracy")
CURVES_CSV = CsvFile("curves.csv", CURVE_COLUMNS)
LINKS = ("bw=100mbit", "bw=1gbit")
#: signSGD's update is lr x (+-1) per value, far above a gradient's: the papers give it a
#: learning rate of its own; here the task's rate times this (one setting, not tuned)
SIGN_LR = 0.01


@dataclass(frozen=True)
class WireRun:
    """One gradient wire of the study: its label and its `[wire.grad]` keys."""

    label: str
    codec: str
    error_feedback: bool = False
    compressor: bool = True
    lr_factor: float = 1.0

    def grad(self, vectors: tuple[str, ...]) -> dict[str, Any]:
        keys: dict[str, Any] = {"codec": self.codec, "error_feedback": self.error_feedback}
        if self.compressor:
            keys["rules"] = [f"{pattern}=fp32" for pattern in vectors]
        return keys


BASELINES = (WireRun("fp32", "fp32", compressor=False), WireRun("bf16", "bf16", compressor=False),
             WireRun("bits4+ef", "bits:auto4", True, compressor=False))
COMPRESSORS = (WireRun("powersgd:2", "powersgd:2"), WireRun("topk:0.01", "topk:0.01"),
               WireRun("randomk:0.01", "randomk:0.01"), WireRun("qsgd:7", "qsgd:7"),
               WireRun("terngrad", "terngrad"), WireRun("sign+ef", "sign+ef"),
               WireRun("signsgd", "signsgd", lr_factor=SIGN_LR))
WIRES = BASELINES + COMPRESSORS
#: gpt-tiny's vectors: biases and LayerNorm's weights
TEXT_VECTORS = ("*.bias", "type:LayerNorm")


@dataclass(frozen=True)
class Task:
    """One task: its name, the patterns of the parameters a compressor leaves in fp32, and
    its config of one run without wire and link (another preset's task, reused)."""

    name: str
    vectors: tuple[str, ...]
    base: Callable[[int], dict[str, Any]]


def tasks(settings: Settings) -> list[Task]:
    """The image task of `seed004-adaprec` (an MLP on MNIST-1D; the digits at smoke size)
    and the data-parallel gpt-tiny run of `transformer-wire`, on 2 ranks."""
    def image(seed: int) -> dict[str, Any]:
        config = adaprec_task(settings, seed)
        config["train"] = {**config["train"], "world_size": 2}
        return config

    def text(seed: int) -> dict[str, Any]:
        return TextRun("weight gradients", "fp32", 32).sections(
            seed, settings.pick(1, 2, 4), 64, 32)

    image_name = "digits" if settings.size == "smoke" else "mnist1d"
    out = [Task(image_name, ("*.bias",), image)]
    return out if settings.size == "smoke" else out + [Task("gpt-tiny", TEXT_VECTORS, text)]


def plan(settings: Settings) -> list[tuple[Task, str, WireRun]]:
    """Every (task, link, wire) of this size; the smoke size checks the machinery only."""
    wires = settings.pick((BASELINES[0], COMPRESSORS[1], COMPRESSORS[-1]), WIRES, WIRES)
    links = settings.pick(LINKS[1:], LINKS, LINKS)
    return [(t, link, w) for t in tasks(settings) for link in links for w in wires]


def sections(task: Task, link: str, wire: WireRun, seed: int) -> dict[str, Any]:
    """The config of one run: the task's, behind `link`, its gradients on `wire`."""
    config = task.base(seed)
    lr = float(config["optim"]["lr"]) * wire.lr_factor
    return {**config, "optim": {**config["optim"], "lr": lr}, "comm": {"link": link},
            "dp": {"calibration": "off"}, "wire": {"grad": wire.grad(task.vectors)}}


def collect(settings: Settings) -> Meta:
    """One run per (task, link, wire, seed); write runs.csv and curves.csv."""
    seeds = settings.seed_list()
    rows: list[Row] = []
    curves: list[Row] = []
    for task, link, wire in plan(settings):
        for seed in seeds:
            print(f"[{NAME}] {task.name}, {link}: {wire.label}, seed {seed}", flush=True)
            config = sections(task, link, wire, seed)
            slug = f"{task.name}-{link.removeprefix('bw=')}-{wire.label}-s{seed}"
            run_dir = settings.out / "runs" / slug.replace(":", "-").replace("+", "-")
            summary = train_run(config, run_dir)
            keys = {"task": task.name, "link": link, "wire": wire.label, "seed": seed}
            epochs = epochs_of(run_dir)
            rows.append({**keys, "final_accuracy": summary["test_accuracy"],
                         "final_loss": epochs[-1]["test_loss"],
                         "wall_time_s": sum(float(r["epoch_time_s"]) for r in epochs),
                         "bytes_sent": summary.get("bytes_sent", 0),
                         "lr": config["optim"]["lr"]})
            elapsed = 0.0
            for rec in epochs:
                elapsed += float(rec["epoch_time_s"])
                curves.append({**keys, "epoch": rec["epoch"], "elapsed_s": elapsed,
                               "test_accuracy": rec["test_accuracy"]})
    RUNS_CSV.write(settings.out, rows)
    CURVES_CSV.write(settings.out, curves)
    return {"seeds": seeds, "ranks": 2, "sign_lr": SIGN_LR,
            "tasks": {t.name: {**{k: t.base(0)[k] for k in ("data", "model", "optim")},
                               "epochs": t.base(0)["train"]["epochs"],
                               "fp32": list(t.vectors)} for t in tasks(settings)}}


def render(out: Path, meta: Meta) -> str:
    return report(out, meta, RUNS_CSV.read(out), CURVES_CSV.read(out), [w.label for w in WIRES])


PRESET = Preset(listing(NAME), files=(RUNS_CSV, CURVES_CSV), collect=collect, render=render)
