"""`seed003-tp`: what each wire format costs tensor-parallel training, within a layer.

Seed 003 names three ways to split a model: by layers, within a layer, by channel;
this preset asks seed 000's question of the last two. `--parallel tensor --tp 2` trains
gpt-tiny on the embedded text (heads and MLP pairs split) and the accuracy presets'
CNN task (`experiments.task`: MNIST-1D with the narrow 1-D ResNet, CIFAR-10 with a
ResNet from `--data-dir`; split by channel) with each format on the forward wire
(`wire.tp_fwd`: the row-parallel partial sums) or on the backward wire (`wire.tp_bwd`:
the column-parallel input gradients), each without and with error feedback, against an
fp32 run of the same seed; the same formats on the activations of a 2-stage pipeline
cut of the same model (between layers) against its own fp32 run; and one epoch of fp32,
bf16 and fp8-e4m3 forward wires through an emulated 100 Mbit/s link (the step-time target).
`--smoke` trains the digits' MLP with one format: it checks the machinery only.

CSV `accuracy.csv`, one row per run: task, parallel (tensor, pipeline), direction (fwd,
bwd; `-` for an fp32 reference), codec, bits_per_value, error_feedback (0/1), seed,
epochs, test_accuracy, test_loss, train_loss (last epoch), step_time_s, bytes_per_step
(all links, last epoch). CSV `link.csv`, one row per link run: task, link, codec,
bits_per_value, seed, steps, step_time_s, bytes_per_step, test_accuracy. The report is
`seed003_tp_report`, its verdicts `seed003_tp_trends`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from approxdist.comm.codecs import get_codec
from approxdist.experiments import markdown as md
from approxdist.experiments.base import Meta, Preset, Settings
from approxdist.experiments.catalog import listing
from approxdist.experiments.csvio import Row
from approxdist.experiments.runs import epochs_of, train_run
from approxdist.experiments.seed003_tp_report import (
    ACCURACY_CSV,
    BUDGET,
    LINK_CSV,
    NAME,
    STUDIES,
    accuracy_table,
    finals,
    link_table,
    plot,
    reference,
)
from approxdist.experiments.seed003_tp_trends import trend_rows
from approxdist.experiments.task import Task, task_for

Sections = dict[str, dict[str, Any]]

#: the formats put on each wire: 16- and 8-bit floats, seed 000's signed 8-bit bit-field
#: ("sign 7+1"), the data-aware signed 4-bit bit-field, seed 004's Table-4
FORMATS = ("bf16", "fp8-e4m3", "fp8-e5m2", "bits:s1e6m1", "bits:auto4", "table4")
#: `--quick`: one format per width (16, 8, 4 bits)
QUICK_FORMATS = ("bf16", "fp8-e4m3", "bits:auto4")
#: the link of the step-time target, and the forward wires timed through it
LINK = "bw=100mbit"
LINK_FORMATS = ("fp32", "bf16", "fp8-e4m3")
TP = 2
GPT_WHY = ("gpt-tiny (docs/models.md) on `stdlib-text`, byte-level language modelling on "
           "the Python standard library's sources (no download); accuracy is next-byte "
           "accuracy. tp = 2 splits each block's heads and its MLP pair, so every block "
           "all-reduces twice forward and twice backward.")


@dataclass(frozen=True)
class Run:
    """One training run: a format on one wire of one parallel mode."""

    parallel: str  # "tensor" or "pipeline"
    direction: str  # "fwd", "bwd", or "-" (the fp32 reference)
    codec: str = "fp32"
    feedback: bool = False

    def sections(self, task: Task, seed: int, link: str = "",
                 epochs: int | None = None) -> Sections:
        """The config: the task's 2-stage pipeline, or the same model at tp = 2."""
        fwd = self.codec if self.direction == "fwd" else "fp32"
        sec = task.sections(seed, epochs=epochs, fwd_codec=fwd, link=link)
        if self.parallel == "pipeline":
            return sec
        sec.pop("pipeline")
        wire = {f"tp_{d}": {"codec": self.codec if d == self.direction else "fp32",
                            "error_feedback": self.feedback and d == self.direction}
                for d in ("fwd", "bwd")}
        return {**sec, "train": {**sec["train"], "parallel": "tensor", "world_size": TP},
                "tp": {"size": TP}, "wire": wire}

    def slug(self, key: str, seed: int) -> str:
        codec = self.codec.replace(":", "-").replace("+", "p")
        return (f"{key}-{self.parallel}-{self.direction.replace('-', 'ref')}-{codec}"
                f"{'-ef' if self.feedback else ''}-s{seed}")


def runs(settings: Settings) -> list[Run]:
    """The accuracy matrix of one task: references first, then each format on each wire.
    Smoke: one format, the fewest runs that reach every table and verdict."""
    if settings.size == "smoke":
        fmt = "fp8-e4m3"
        return [Run("tensor", "-"), Run("tensor", "fwd", fmt), Run("tensor", "fwd", fmt, True),
                Run("tensor", "bwd", fmt), Run("pipeline", "-"), Run("pipeline", "fwd", fmt)]
    out = [Run("tensor", "-"), Run("pipeline", "-")]
    for codec in settings.pick((), QUICK_FORMATS, FORMATS):
        out += [Run("tensor", d, codec, fb) for d in ("fwd", "bwd") for fb in (False, True)]
        out.append(Run("pipeline", "fwd", codec))
    return out


def link_formats(settings: Settings) -> tuple[str, ...]:
    return ("fp32", "fp8-e4m3") if settings.size == "smoke" else LINK_FORMATS


def gpt_task(settings: Settings) -> Task:
    """gpt-tiny on the embedded text, as `transformer-wire` trains it."""
    return Task(key="gpt-tiny", dataset="stdlib-text", model={"name": "gpt-tiny"}, split="",
                epochs=settings.pick(1, 1, 2), batch_size=32, lr=0.3,
                cut="the middle block boundary (64 tokens x 64 values per sample)",
                why=GPT_WHY, extra_data={"seq_len": 64})


def tasks(settings: Settings) -> list[Task]:
    """gpt-tiny and the CNN task (smoke: the digits' MLP only)."""
    cnn = task_for(settings)
    return [cnn] if settings.size == "smoke" else [gpt_task(settings), cnn]


def collect(settings: Settings) -> Meta:
    """Every task's accuracy matrix per seed, then its link runs; write the two CSVs."""
    seeds = settings.seed_list()
    rows: list[Row] = []
    links: list[Row] = []
    for task in tasks(settings):
        for seed in seeds:
            for run in runs(settings):
                print(f"[{NAME}] {task.key} seed {seed}: {run.parallel} {run.direction} "
                      f"{run.codec}{' + error feedback' if run.feedback else ''}", flush=True)
                run_dir = settings.out / "runs" / run.slug(task.key, seed)
                train_run(run.sections(task, seed), run_dir)
                rows.append(_accuracy_row(task, run, seed, run_dir))
        for codec in link_formats(settings):
            print(f"[{NAME}] {task.key}: {codec} forward wire through {LINK}", flush=True)
            run = Run("tensor", "fwd", codec)
            run_dir = settings.out / "runs" / f"link-{run.slug(task.key, 0)}"
            train_run(run.sections(task, 0, link=LINK, epochs=1), run_dir)
            links.append(_link_row(task, codec, run_dir))
    ACCURACY_CSV.write(settings.out, rows)
    LINK_CSV.write(settings.out, links)
    return {"tasks": {t.key: {**t.describe(), "model": t.model} for t in tasks(settings)},
            "seeds": seeds, "formats": list(dict.fromkeys(r.codec for r in runs(settings))),
            "link": LINK, "tp": TP}


def _last_epoch(run_dir: Path) -> dict[str, Any]:
    """The last epoch's record, with its step count, time and bytes per step (all links)."""
    records = epochs_of(run_dir)
    last = records[-1]
    steps = int(last["step"]) - (int(records[-2]["step"]) if len(records) > 1 else 0)
    sent = sum(int(v) for v in last.get("bytes_sent", {}).values())
    return {**last, "steps": steps, "bytes_per_step": sent / max(1, steps)}


def _accuracy_row(task: Task, run: Run, seed: int, run_dir: Path) -> Row:
    last = _last_epoch(run_dir)
    return {"task": task.key, "parallel": run.parallel, "direction": run.direction,
            "codec": run.codec, "bits_per_value": get_codec(run.codec).bits_per_value,
            "error_feedback": int(run.feedback), "seed": seed, "epochs": last["epoch"],
            "test_accuracy": last["test_accuracy"], "test_loss": last["test_loss"],
            "train_loss": last["train_loss"], "step_time_s": last["step_time_s"],
            "bytes_per_step": last["bytes_per_step"]}


def _link_row(task: Task, codec: str, run_dir: Path) -> Row:
    last = _last_epoch(run_dir)
    return {"task": task.key, "link": LINK, "codec": codec,
            "bits_per_value": get_codec(codec).bits_per_value, "seed": 0,
            "steps": last["steps"], "step_time_s": last["step_time_s"],
            "bytes_per_step": last["bytes_per_step"], "test_accuracy": last["test_accuracy"]}


# -- report ------------------------------------------------------------------------------
def render(out: Path, meta: Meta) -> str:
    rows = ACCURACY_CSV.read(out)
    links = LINK_CSV.read(out)
    fin = finals(rows)
    tasks: dict[str, Any] = meta["tasks"]
    title = f"{NAME}: tp = {meta['tp']}, {len(meta['seeds'])} seed(s)"
    result = [_setup(meta), STUDIES]
    for key, task in tasks.items():
        tp_ref, pp_ref = reference(fin, key, "tensor"), reference(fin, key, "pipeline")
        result += [f"**{key}** ({task['dataset']}, model {_model(task['model'])}, "
                   f"{task['epochs']} epoch(s), batch {task['batch_size']}, lr {task['lr']}). "
                   f"fp32 references: tensor parallel {md.pct_spread(tp_ref)}, pipeline "
                   f"{md.pct_spread(pp_ref)}. Final test accuracy (change against the fp32 "
                   f"run of the same mode and seed):", accuracy_table(fin, key)]
    result += [f"**Through an emulated {meta['link']} link** (one epoch, seed 0, the "
               "other wire fp32; milliseconds per training step, bytes handed to "
               "`torch.distributed` per step):"]
    result += [f"{key}:\n\n{link_table(links, fin, key)}" for key in tasks]
    figure = plot(out, fin, list(tasks), title)
    return md.report(
        result, [md.image(figure, "accuracy change per format and place")],
        trend_rows(fin, links, list(tasks)), _differences(meta),
        trends_title="Trends of the seed's question (003) and the studies' claims")


def _setup(meta: Meta) -> str:
    whys = " ".join(str(t["why"]) for t in meta["tasks"].values())
    return (f"`--parallel tensor --tp {meta['tp']}`: each format on the forward wire "
            "(`wire.tp_fwd`, the row-parallel layers' partial sums) or on the backward "
            "wire (`wire.tp_bwd`, the column-parallel layers' input gradients), the other "
            "wire fp32, without and with error feedback (`--set "
            "wire.tp_fwd.error_feedback=true`); and on the activations of a 2-stage GPipe "
            "pipeline cut of the same model (`--parallel pipeline --stages 2 --fwd-codec "
            f"X`, 4 micro-batches). Seeds {meta['seeds']}. {whys} How tensor parallelism "
            "and its wires work: docs/tensor_parallel.md; the preset: docs/experiments.md. "
            f"The verdicts below compare means over seeds with a budget of "
            f"{100 * BUDGET:.0f} point of final accuracy; each mean's spread over seeds is "
            "in the tables (± sample std): a verdict that rests on differences within it "
            "is weak.")


def _model(model: dict[str, Any]) -> str:
    extra = ", ".join(f"{k}={v}" for k, v in model.items() if k != "name")
    return f"`{model['name']}`" + (f" ({extra})" if extra else "")


def _differences(meta: Meta) -> str:
    return ("Both studies trained models of 100 M parameters and more with Megatron-LM "
            "on GPUs over NVLink and InfiniBand; here tiny models train on local CPU "
            f"processes of one machine (tp = {meta['tp']}), so the links' time is emulated "
            "and compute is slow, which favours compression less than a real slow "
            "network would. Their compressors include TopK, low-rank and learned "
            "auto-encoders; ours are the wire formats of this library (casts, fp8, "
            "bit-fields, Table-N), each with its own error bound (docs/codecs.md).")


PRESET = Preset(listing(NAME), files=(ACCURACY_CSV, LINK_CSV), collect=collect, render=render)
