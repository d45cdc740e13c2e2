"""`transformer-wire`: what each wire format costs a transformer in validation loss.

gpt-tiny on `stdlib-text` (byte-level language modelling, no download). Three places a
format can sit, each against an fp32 run of the same mode and seed:

- *activations*: a 2-stage GPipe pipeline (4 micro-batches), the format on the
  activations crossing the cut (`--fwd-codec`), their gradients in fp32;
- *activation gradients*: the same pipeline, the format on the gradients coming back
  (`--bwd-codec`), activations in fp32;
- *weight gradients*: data parallelism on 2 ranks, the format on the gradient
  all-reduce (`--codec`).

CSV `wire.csv`, one row per run: place, codec, bits_per_value, seed, epochs,
val_loss (nats per byte), val_accuracy (next-byte, fraction), train_loss, bytes_sent
(all ranks, whole run). The report gives each format's validation-loss change against
its fp32 reference (relative), per place, and which formats stay within 1 %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from approxdist.experiments import markdown as md
from approxdist.experiments import plots
from approxdist.experiments.base import Meta, Preset, Settings
from approxdist.experiments.catalog import listing
from approxdist.experiments.csvio import CsvFile, Row
from approxdist.experiments.runs import epochs_of, train_run

NAME = "transformer-wire"
COLUMNS = ("place", "codec", "bits_per_value", "seed", "epochs", "val_loss", "val_accuracy",
           "train_loss", "bytes_sent")
WIRE_CSV = CsvFile("wire.csv", COLUMNS)
FORMATS = (("bf16", 16), ("fp16", 16), ("fp8-e4m3", 8), ("fp8-e5m2", 8), ("table4", 4))
PLACES = ("activations", "activation gradients", "weight gradients")
#: a format within this share of its reference's validation loss "costs nothing"
BUDGET = 0.01


@dataclass(frozen=True)
class Run:
    place: str
    codec: str
    bits: int

    def sections(self, seed: int, epochs: int, seq_len: int, batch: int) -> dict[str, Any]:
        """The config of this run (fp32 references are runs of codec fp32)."""
        common: dict[str, Any] = {
            "train": {"seed": seed, "epochs": epochs, "progress": False, "log_every": 100000},
            "data": {"dataset": "stdlib-text", "seq_len": seq_len, "batch_size": batch},
            "model": {"name": "gpt-tiny"}, "optim": {"lr": 0.3}}
        if self.place == "weight gradients":
            return {**common, "train": {**common["train"], "parallel": "dp", "world_size": 2},
                    "dp": {"calibration": "off"}, "wire": {"grad": {"codec": self.codec}}}
        direction = "fwd" if self.place == "activations" else "bwd"
        return {**common, "train": {**common["train"], "parallel": "pipeline", "world_size": 2},
                "pipeline": {"stages": 2, "microbatches": 4, "schedule": "gpipe"},
                "wire": {direction: {"codec": self.codec}}}


def runs(settings: Settings) -> list[Run]:
    formats = settings.pick((("bf16", 16),), FORMATS, FORMATS)
    places = settings.pick(PLACES[:1], PLACES, PLACES)
    out = []
    for place in places:
        out.append(Run(place, "fp32", 32))
        out += [Run(place, codec, bits) for codec, bits in formats]
    return out


def collect(settings: Settings) -> Meta:
    """Train every (place, format) and its fp32 reference per seed; write wire.csv."""
    seeds = settings.seed_list()
    epochs = settings.pick(1, 1, 2)
    seq_len, batch = settings.pick(128, 64, 64), settings.pick(64, 32, 32)
    rows: list[Row] = []
    for run in runs(settings):
        for seed in seeds:
            slug = f"{run.place.replace(' ', '-')}-{run.codec.replace(':', '-')}-seed{seed}"
            print(f"[{NAME}] {run.place}: {run.codec}, seed {seed}", flush=True)
            run_dir = settings.out / "runs" / slug
            summary = train_run(run.sections(seed, epochs, seq_len, batch), run_dir)
            last = epochs_of(run_dir)[-1]
            rows.append({"place": run.place, "codec": run.codec, "bits_per_value": run.bits,
                         "seed": seed, "epochs": epochs, "val_loss": last["test_loss"],
                         "val_accuracy": last["test_accuracy"],
                         "train_loss": last["train_loss"],
                         "bytes_sent": summary.get("bytes_sent", 0)})
    WIRE_CSV.write(settings.out, rows)
    return {"seeds": seeds, "epochs": epochs, "seq_len": seq_len, "batch_size": batch,
            "model": "gpt-tiny", "dataset": "stdlib-text"}


def changes(rows: list[Row]) -> dict[tuple[str, str], dict[str, float]]:
    """Per (place, codec): mean validation loss, its relative change against the place's
    fp32 reference of the same seeds (mean over seeds, and the largest), bits."""
    ref = {(r["place"], r["seed"]): float(r["val_loss"]) for r in rows if r["codec"] == "fp32"}
    out: dict[tuple[str, str], dict[str, float]] = {}
    for key in dict.fromkeys((r["place"], r["codec"]) for r in rows):
        mine = [r for r in rows if (r["place"], r["codec"]) == key]
        rel = [float(r["val_loss"]) / ref[(r["place"], r["seed"])] - 1 for r in mine
               if (r["place"], r["seed"]) in ref]
        out[key] = {"val_loss": sum(float(r["val_loss"]) for r in mine) / len(mine),
                    "val_accuracy": sum(float(r["val_accuracy"]) for r in mine) / len(mine),
                    "change": sum(rel) / len(rel) if rel else math.nan,
                    "worst": max(rel, key=abs) if rel else math.nan,
                    "bits": float(mine[0]["bits_per_value"])}
    return out


def result_table(ch: dict[tuple[str, str], dict[str, float]]) -> str:
    rows = [(place, f"`{codec}`", int(v["bits"]), f"{v['val_loss']:.4f}",
             f"{100 * v['val_accuracy']:.2f} %",
             "reference" if codec == "fp32" else f"{100 * v['change']:+.2f} %",
             "-" if codec == "fp32" else f"{100 * v['worst']:+.2f} %")
            for (place, codec), v in ch.items()]
    return md.table(("place", "format", "bits", "val. loss (nats/byte)", "val. accuracy",
                     "loss vs fp32 (mean)", "worst seed"), rows)


def trend_rows(ch: dict[tuple[str, str], dict[str, float]]) -> list[md.Trend]:
    """Per place: which formats stay within the budget, computed from the run."""
    out: list[md.Trend] = []
    for place in PLACES:
        mine = {c: v for (p, c), v in ch.items() if p == place and c != "fp32"}
        if not mine:
            continue
        cheap = [c for c, v in mine.items() if abs(v["change"]) <= BUDGET]
        sixteen = [c for c, v in mine.items() if v["bits"] == 16]
        ok = all(c in cheap for c in sixteen) if sixteen else None  # None: not measured
        dearest = max(mine, key=lambda c: mine[c]["change"])
        why = (f"within {100 * BUDGET:.0f} %: {', '.join(cheap) or 'none'}; the dearest is "
               f"{dearest} ({100 * mine[dearest]['change']:+.2f} %)")
        out.append((f"(not in the seeds) 16-bit formats cost a transformer's {place} at most "
                    f"{100 * BUDGET:.0f} % validation loss",
                    ", ".join(f"{c} {100 * mine[c]['change']:+.2f} %" for c in sixteen) or "-",
                    ok, why))
    return out


def plot(out: Path, ch: dict[tuple[str, str], dict[str, float]], title: str) -> str:
    fig, (ax,) = plots.figure(1)
    codecs = list(dict.fromkeys(c for (_, c) in ch if c != "fp32"))
    width = 0.8 / max(1, len(PLACES))
    for i, place in enumerate(PLACES):
        xs = [j + i * width for j, c in enumerate(codecs) if (place, c) in ch]
        ys = [100 * ch[(place, c)]["change"] for c in codecs if (place, c) in ch]
        if xs:
            ax.bar(xs, plots.finite(ys, 0.0), width, label=place)
    ax.set_xticks([j + width for j in range(len(codecs))], codecs)
    ax.axhline(100 * BUDGET, color="grey", linestyle=":", linewidth=1)
    ax.legend()
    plots.label(ax, "wire format", "validation loss vs fp32 (%)",
                "what each format costs (dotted: 1 %)")
    plots.save(fig, out / "wire_cost.png", title)
    return "wire_cost.png"


def render(out: Path, meta: Meta) -> str:
    rows = WIRE_CSV.read(out)
    ch = changes(rows)
    title = (f"{NAME}: {meta['model']} on {meta['dataset']} (seq {meta['seq_len']}, batch "
             f"{meta['batch_size']}), {meta['epochs']} epoch(s), {len(meta['seeds'])} seed(s)")
    figure = plot(out, ch, title)
    return md.report(
        ["Validation loss after the last epoch, mean over seeds; each format against the fp32 "
         "run of its own mode and seed (pipeline: 2 stages, GPipe, 4 micro-batches; weight "
         "gradients: data parallelism on 2 ranks).", result_table(ch)],
        [md.image(figure, "validation loss change per format and place")],
        trend_rows(ch))


PRESET = Preset(listing(NAME), files=(WIRE_CSV,), collect=collect, render=render)
