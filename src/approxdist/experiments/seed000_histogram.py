"""`seed000-histogram`: exponent histogram of the transferred activations, seed 000 Fig. 5.

Seed 000 (section 4.4) took 1 M fp32 values crossing the stage boundary in epoch 1 and
histogrammed their 8-bit exponent field: ~18 % exact zeros (after ReLU), > 99.99 %
expressible by the top 2 + bottom 2 exponent bits, 0.006 % elsewhere; the 4-bit scheme
`bits:s0e2+2m0` was chosen from that. Here the task's model is trained in one process
(the values that cross the cut of a fp32 pipeline are the first stage's outputs: same
blocks, same cut) and every output of the first stage is kept, strided down to at most
1 M values per epoch, in epoch 1 and in the last epoch (the seed asks whether the shape
holds later in training). Analysis: `approxdist.comm.exponents`.
CSVs: `histogram.csv` (epoch, exponent 0-255, count) and `coverage.csv` (epoch,
total_values, zero_fraction, scheme, bits, coverage = share of values whose sign-free
exponent the scheme reproduces exactly; `bits:auto<K>` rows: sign and exponent).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from matplotlib.patches import Patch

from approxdist.comm.exponents import TARGET_COVERAGE, exponent_report
from approxdist.config.loader import build_config
from approxdist.experiments import markdown as md
from approxdist.experiments import plots
from approxdist.experiments.base import Meta, Preset, Settings
from approxdist.experiments.catalog import listing
from approxdist.experiments.csvio import CsvFile, Row, group
from approxdist.experiments.task import task_for

NAME = "seed000-histogram"
LIMIT = 1_000_000
HIST_COLUMNS = ("epoch", "exponent", "count")
HISTOGRAM_CSV = CsvFile("histogram.csv", HIST_COLUMNS)
COVER_COLUMNS = ("epoch", "total_values", "zero_fraction", "scheme", "bits", "coverage")
COVERAGE_CSV = CsvFile("coverage.csv", COVER_COLUMNS)
SEED_SCHEME = "bits:s0e2+2m0"


class CutSampler:
    """Forward hook on the last block of stage 0: keeps a strided sample of its outputs."""

    def __init__(self, per_epoch: int, limit: int = LIMIT) -> None:
        self.stride = max(1, math.ceil(per_epoch / limit))
        self.epoch = 0
        self.keep: set[int] = set()
        self.values: dict[int, list[torch.Tensor]] = {}

    def __call__(self, module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
        if module.training and self.epoch in self.keep:
            flat = output.detach().reshape(-1)[:: self.stride].float().clone()
            self.values.setdefault(self.epoch, []).append(flat)


def _sample(settings: Settings) -> tuple[dict[int, torch.Tensor], Meta]:
    """Train single-process with the sampler on the cut; values per kept epoch (1-based)."""
    from approxdist.launch.context import DistContext
    from approxdist.train.build import build_trainer

    task = task_for(settings)
    sections = task.sections(0)
    sections["train"].update(parallel="single", world_size=1)
    sections["pipeline"] = {}
    cfg = build_config(sections)
    run_dir = settings.out / "runs" / "fp32-single"
    trainer = build_trainer(cfg, DistContext(), run_dir, False)
    cut = int(task.split.split(",")[0])
    model = trainer.engine.module
    assert isinstance(model, torch.nn.Sequential)
    with torch.no_grad():
        per_sample = model[:cut](trainer.data.train_x[:2]).numel() // 2
    sampler = CutSampler(per_sample * trainer.data.train_x.shape[0])
    sampler.keep = {0, cfg.train.epochs - 1}
    handle = model[cut - 1].register_forward_hook(sampler)

    def at_epoch(epoch: int) -> None:
        sampler.epoch = epoch

    trainer.epoch_hooks.append(at_epoch)
    print(f"[{NAME}] training {cfg.model.name} on {cfg.data.dataset} for {cfg.train.epochs} "
          f"epoch(s), sampling the cut after block {cut - 1}", flush=True)
    trainer.run()
    handle.remove()
    (run_dir / "checkpoint.pt").unlink(missing_ok=True)
    values = {e + 1: torch.cat(v) for e, v in sampler.values.items()}
    return values, {"task": task.describe(), "stride": sampler.stride,
                    "values_per_sample": per_sample}


def _rows(epoch: int, x: torch.Tensor) -> tuple[list[Row], list[Row]]:
    rep = exponent_report(x)
    hist = [{"epoch": epoch, "exponent": e, "count": c} for e, c in enumerate(rep.histogram)]
    base = {"epoch": epoch, "total_values": rep.total, "zero_fraction": rep.zero_fraction}
    cover = [{**base, "scheme": s, "bits": _width(s), "coverage": c}
             for s, c in rep.coverage.items()]
    cover += [{**base, "scheme": f"bits:auto{k}", "bits": k, "coverage": c}
              for k, c in rep.auto_coverage.items()]
    return hist, cover


def _width(spec: str) -> int:
    return sum(int(p) for p in spec.split("e")[1].split("m")[0].split("+"))


def collect(settings: Settings) -> Meta:
    values, meta = _sample(settings)
    hist: list[Row] = []
    cover: list[Row] = []
    for epoch, x in sorted(values.items()):
        h, c = _rows(epoch, x)
        hist += h
        cover += c
    HISTOGRAM_CSV.write(settings.out, hist)
    COVERAGE_CSV.write(settings.out, cover)
    return meta


def representable(top: int, bottom: int) -> list[int]:
    """Exponent fields that `bits:s0e<top>+<bottom>m0` reproduces (unsent bits 0)."""
    kept = sum(1 << (7 - i) for i in range(top)) | ((1 << bottom) - 1)
    return [e for e in range(256) if e & ~kept & 0xFF == 0]


def plot(out: Path, hist: list[Row], title: str) -> str:
    by_epoch = group(hist, "epoch")
    fig, axes = plots.figure(len(by_epoch))
    seed_ok = set(representable(2, 2))
    for ax, ((epoch,), rows) in zip(axes, sorted(by_epoch.items())):
        total = sum(r["count"] for r in rows) or 1
        used = [r for r in rows if r["count"] > 0]
        xs = [int(r["exponent"]) for r in used]
        shares = [100 * r["count"] / total for r in used]
        colors = ["tab:green" if x in seed_ok else "tab:gray" for x in xs]
        ax.bar(xs, shares, width=0.9, color=colors)
        ax.set_yscale("log")
        ax.set_xlim(-3, max(xs, default=0) + 8)
        plots.label(ax, "8-bit exponent field e (value ~ 2^(e-127); 0 = zero)",
                    "share of values (%), log scale", f"epoch {int(epoch)}, {int(total):,} values",
                    legend=False)
        ax.legend(handles=[Patch(color="tab:green", label=f"kept exactly by {SEED_SCHEME}"),
                           Patch(color="tab:gray", label="not representable by it")], fontsize=7)
    plots.save(fig, out / "exponent_histogram.png", title)
    return "exponent_histogram.png"


def best_per_width(cover: list[Row], epoch: float) -> list[Row]:
    """The best exponent-only scheme of each width, and bits:auto<K>, for one epoch."""
    rows = [r for r in cover if r["epoch"] == epoch]
    best: dict[tuple[str, float], Row] = {}
    for r in rows:
        kind = "auto" if "auto" in r["scheme"] else "bits"
        key = (kind, r["bits"])
        if key not in best or r["coverage"] > best[key]["coverage"]:
            best[key] = r
    return sorted(best.values(), key=lambda r: (r["bits"], "auto" in r["scheme"]))


def suggestion(cover: list[Row], epoch: float, prefix: str) -> str:
    """The narrowest scheme starting with `prefix` that keeps >= 99.99 % (seed 000's criterion)."""
    ok = [r for r in best_per_width(cover, epoch)
          if str(r["scheme"]).startswith(prefix) and r["coverage"] >= TARGET_COVERAGE]
    return str(ok[0]["scheme"]) if ok else "none (no scheme reaches 99.99 %)"


def coverage_of(cover: list[Row], epoch: float, scheme: str) -> float:
    return next((float(r["coverage"]) for r in cover
                 if r["epoch"] == epoch and r["scheme"] == scheme), math.nan)


def summary_table(cover: list[Row]) -> str:
    rows: list[tuple[object, ...]] = []
    for (epoch,), rs in sorted(group(cover, "epoch").items()):
        r0 = rs[0]
        rows.append((int(epoch), f"{int(r0['total_values']):,}", md.pct(r0["zero_fraction"]),
                     md.pct(coverage_of(cover, epoch, SEED_SCHEME), 3),
                     f"`{suggestion(cover, epoch, 'bits:s0')}`",
                     f"`{suggestion(cover, epoch, 'bits:auto')}`"))
    rows.append(("seed 000, epoch 1", "1,000,000", "~18 %", "> 99.99 %", f"`{SEED_SCHEME}`", "-"))
    return md.table(("epoch", "values", "exact zeros", f"kept by `{SEED_SCHEME}`",
                     "narrowest `bits:s0e..m0` >= 99.99 %", "narrowest `bits:auto<K>` >= 99.99 %"),
                    rows)


def width_table(cover: list[Row], epoch: float) -> str:
    best = best_per_width(cover, epoch)
    widths = sorted({int(r["bits"]) for r in best})
    rows = []
    for w in widths:
        plain = [r for r in best if r["bits"] == w and "auto" not in str(r["scheme"])]
        auto = [r for r in best if r["bits"] == w and "auto" in str(r["scheme"])]
        rows.append((w, f"`{plain[0]['scheme']}` {md.pct(plain[0]['coverage'], 3)}" if plain else "-",
                     md.pct(auto[0]["coverage"], 3) if auto else "-"))
    return md.table(("exponent bits", "best `bits:s0e..m0` (unsent bits 0), kept exactly",
                     "`bits:auto<K>` (sign + exponent, observed constants), kept exactly"), rows)


def trend_rows(cover: list[Row]) -> list[md.Trend]:
    epochs = sorted({r["epoch"] for r in cover})
    first, last = epochs[0], epochs[-1]
    zeros = float(next(r["zero_fraction"] for r in cover if r["epoch"] == first))
    seed_cov = coverage_of(cover, first, SEED_SCHEME)
    best4 = max(float(r["coverage"]) for r in cover if r["epoch"] == first and r["bits"] == 4)
    pick = suggestion(cover, first, "bits:auto")
    later = coverage_of(cover, last, pick)
    return [
        ("a large share of exact zeros after ReLU (~18 %)", md.pct(zeros), zeros >= 0.05,
         "the share depends on the layer before the cut; ours ends in batch norm + ReLU"),
        (f"`{SEED_SCHEME}` keeps > 99.99 % of exponents", md.pct(seed_cov, 3),
         seed_cov >= TARGET_COVERAGE,
         "the seed's activations lay in [2, 32) (exponents 128-131); ours are batch-normalised, "
         "mostly below 2, where zero-filled middle exponent bits turn x into ~2^-60"),
        ("a 4-bit exponent code chosen from the histogram keeps > 99.99 %", md.pct(best4, 3),
         best4 >= TARGET_COVERAGE, "best of all 4-bit `bits:s0e..m0` and `bits:auto4` codes"),
        ("(open in the seed) the histogram keeps its shape later in training",
         f"`{pick}` from epoch {int(first)} keeps {md.pct(later, 3)} at epoch {int(last)}",
         None if first == last else later >= TARGET_COVERAGE, ""),
    ]


def _kept(stride: int) -> str:
    return "all of them kept" if stride == 1 else f"one value in {stride} kept"


def render(out: Path, meta: Meta) -> str:
    hist = HISTOGRAM_CSV.read(out)
    cover = COVERAGE_CSV.read(out)
    task = meta["task"]
    title = (f"{NAME}: exponents of activations at the cut, {task['dataset']} / "
             f"{task['model']['name']} (split {task['split']})")
    png = plot(out, hist, title)
    first = min(r["epoch"] for r in cover)
    return md.report(
        [f"Values crossing the cut ({task['cut']}), {_kept(meta['stride'])}, training in one "
         f"process with fp32.", summary_table(cover),
         f"Best code of each width, epoch {int(first)}:", width_table(cover, first)],
        [md.image(png, "exponent histogram"),
         "Seed 000's Fig. 5 is the same histogram for ResNet-56 on CIFAR-10 (linear scale, "
         "1 M values of epoch 1); its numbers are in the last table row."],
        trend_rows(cover))


PRESET = Preset(listing(NAME), files=(HISTOGRAM_CSV, COVERAGE_CSV), collect=collect, render=render)
