"""The `compressors` preset's report: time to accuracy per wire, each paper's headline claim
beside our measurement with a computed verdict, and accuracy against time.

The target of "time to accuracy" is fp32's final accuracy (mean over seeds) minus 1 point,
per task and link; a wire's time is the training time until its first epoch at or above
the target (mean over seeds; "not reached" when a seed never got there). An accuracy claim
("without accuracy loss", "on par with SGD") holds when the wire's final accuracy is at
least fp32's minus 1 point. The claims are read from the papers' abstracts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from approxdist.experiments import markdown as md
from approxdist.experiments import plots
from approxdist.experiments.accuracy import noise, seconds, time_curve, time_to
from approxdist.experiments.base import Meta
from approxdist.experiments.csvio import Row, group, spread

#: "without accuracy loss" within this many accuracy points (a fraction)
TOLERANCE = 0.01
#: float slack at the tolerance's edge (0.79 - 0.80 is -0.0100000000000000089)
EPS = 1e-12
#: the link the time claims are checked on (the one where the wire matters most)
SLOW = "bw=100mbit"


@dataclass(frozen=True)
class Cell:
    """One (task, link, wire): final accuracy over seeds, time to the target, bytes."""

    acc: dict[str, float]
    time: float
    wall: float
    nbytes: float
    #: seeds whose run diverged (a non-finite final loss), of `runs`
    diverged: int = 0
    runs: int = 1

    def accuracy(self) -> str:
        """The final accuracy over seeds, saying how many runs diverged."""
        text = md.pct_spread(self.acc)
        return f"{text} ({self.diverged} of {self.runs} diverged)" if self.diverged else text


def cells(rows: list[Row], curves: list[Row]) -> dict[tuple[str, str, str], Cell]:
    """Per (task, link, wire); the target is the same (task, link)'s fp32 final accuracy
    minus `TOLERANCE`."""
    out: dict[tuple[str, str, str], Cell] = {}
    for (task, link), mine in group(rows, "task", "link").items():
        ref = [float(r["final_accuracy"]) for r in mine if r["wire"] == "fp32"]
        target = spread(ref)["mean"] - TOLERANCE - EPS if ref else math.nan
        for (wire,), runs in group(mine, "wire").items():
            curve = [c for c in curves if (c["task"], c["link"], c["wire"]) == (task, link, wire)]
            out[(task, link, wire)] = Cell(
                spread([float(r["final_accuracy"]) for r in runs]),
                time_to(curve, target) if curve and math.isfinite(target) else math.nan,
                spread([float(r["wall_time_s"]) for r in runs])["mean"],
                spread([float(r["bytes_sent"]) for r in runs])["mean"],
                sum(not math.isfinite(float(r["final_loss"])) for r in runs), len(runs))
    return out


def result_table(cs: dict[tuple[str, str, str], Cell], order: Sequence[str]) -> str:
    body = []
    for task, link, wire in sorted(cs, key=lambda k: (k[0], k[1], _rank(order, k[2]))):
        c, ref = cs[(task, link, wire)], cs.get((task, link, "fp32"))
        vs = f"{c.time / ref.time:.2f}x" if ref and math.isfinite(c.time) and \
            math.isfinite(ref.time) and ref.time > 0 else "-"
        share = f"{c.nbytes / ref.nbytes:.3f}" if ref and ref.nbytes else "-"
        body.append((task, link.removeprefix("bw="), f"`{wire}`", c.accuracy(),
                     seconds(c.time), vs, f"{c.wall:.1f}", share))
    return md.table(("task", "link", "wire", "final test accuracy", "time to target (s)",
                     "vs fp32", "training time (s)", "bytes vs fp32"), body)


def _rank(order: Sequence[str], wire: str) -> int:
    return order.index(wire) if wire in order else len(order)


@dataclass(frozen=True)
class Claim:
    """A paper's headline claim and how our measurement checks it."""

    wire: str
    claim: str
    check: Callable[[dict[tuple[str, str, str], Cell], str, str], tuple[str, bool | None, str]]


def _accuracy(wire: str) -> Callable[..., tuple[str, bool | None, str]]:
    def check(cs: dict[tuple[str, str, str], Cell], task: str, link: str
              ) -> tuple[str, bool | None, str]:
        c, ref = cs.get((task, link, wire)), cs.get((task, link, "fp32"))
        if c is None or ref is None:
            return "-", None, "not run at this size"
        delta = c.acc["mean"] - ref.acc["mean"]
        return (f"{md.pct(c.acc['mean'])} vs fp32 {md.pct(ref.acc['mean'])} "
                f"({md.points(delta)})", delta >= -TOLERANCE - EPS,
                f"diverged in {c.diverged} of {c.runs} run(s): the loss became non-finite"
                if c.diverged else noise(c.acc, ref.acc))
    return check


def _faster(wire: str) -> Callable[..., tuple[str, bool | None, str]]:
    def check(cs: dict[tuple[str, str, str], Cell], task: str, link: str
              ) -> tuple[str, bool | None, str]:
        acc, why = _accuracy(wire)(cs, task, link)[1:]
        c, ref = cs.get((task, link, wire)), cs.get((task, link, "fp32"))
        if c is None or ref is None or not math.isfinite(ref.time):
            return "-", None, "not run at this size, or fp32 missed its own target"
        ok = math.isfinite(c.time) and c.time < ref.time and bool(acc)
        return (f"time to target {_s(c.time)} vs fp32 {_s(ref.time)}; final accuracy within "
                f"{100 * TOLERANCE:.0f} pt: {'yes' if acc else 'no'}", ok, why)
    return check


def _s(value: float) -> str:
    """A time to target in words: '12.3 s' or 'not reached'."""
    return f"{value:.1f} s" if math.isfinite(value) else "not reached"


def _fixes_sign(cs: dict[tuple[str, str, str], Cell], task: str, link: str
                ) -> tuple[str, bool | None, str]:
    ours, ok, why = _accuracy("sign+ef")(cs, task, link)
    sign = cs.get((task, link, "signsgd"))
    if ok is None or sign is None:
        return ours, ok, why
    better = cs[(task, link, "sign+ef")].acc["mean"] >= sign.acc["mean"]
    return (f"{ours}; signsgd {md.pct(sign.acc['mean'])}", ok and better,
            md.join(why, "sign+ef at least signsgd's accuracy: " + ("yes" if better else "no")))


CLAIMS = (
    Claim("powersgd:2", "rank-2 PowerSGD reaches SGD's test accuracy (Vogels, Karimireddy and "
          "Jaggi, \"PowerSGD: Practical Low-Rank Gradient Compression for Distributed "
          "Optimization\", NeurIPS 2019, abstract: \"test performance on par with SGD\")",
          _accuracy("powersgd:2")),
    Claim("topk:0.01", "99 % of the gradient left out without accuracy loss (Lin et al., "
          "\"Deep Gradient Compression\", ICLR 2018, abstract: 270x-600x compression \"without "
          "losing accuracy\"; here plain top-k 1 % with error feedback, without DGC's momentum "
          "correction, clipping and warm-up)", _accuracy("topk:0.01")),
    Claim("qsgd:7", "4-bit QSGD trains to full accuracy in less time (Alistarh et al., "
          "\"QSGD: Communication-Efficient SGD via Gradient Quantization and Encoding\", NeurIPS "
          "2017, abstract: ResNet-152 to full accuracy on ImageNet 1.8x faster on 16 GPUs)",
          _faster("qsgd:7")),
    Claim("terngrad", "ternary gradients without accuracy loss (Wen et al., \"TernGrad: Ternary "
          "Gradients to Reduce Communication in Distributed Deep Learning\", NeurIPS 2017, "
          "abstract: no accuracy loss on AlexNet)", _accuracy("terngrad")),
    Claim("sign+ef", "error feedback makes the sign compressor as accurate as SGD and better "
          "than signSGD (Karimireddy et al., \"Error Feedback Fixes SignSGD and other Gradient "
          "Compression Schemes\", ICML 2019, abstract: compression \"for free\")", _fixes_sign),
    Claim("signsgd", "signSGD with majority vote trains in less time than full precision "
          "(Bernstein et al., \"signSGD with Majority Vote is Communication Efficient and Fault "
          "Tolerant\", ICLR 2019, abstract: 25 % less time for ResNet-50 on ImageNet, 15 "
          "machines)", _faster("signsgd")),
)


def trend_rows(cs: dict[tuple[str, str, str], Cell]) -> list[md.Trend]:
    """Each claim per task on the slow link (or the one measured), then the headline figure."""
    out: list[md.Trend] = []
    for task in sorted({k[0] for k in cs}):
        links = {k[1] for k in cs if k[0] == task}
        link = SLOW if SLOW in links else sorted(links)[0]
        for claim in CLAIMS:
            ours, ok, why = claim.check(cs, task, link)
            out.append((f"{task}, {link.removeprefix('bw=')}: {claim.claim}", ours, ok, why))
        out.append(_half_time(cs, task, link))
    return out


def _half_time(cs: dict[tuple[str, str, str], Cell], task: str, link: str) -> md.Trend:
    claim = (f"{task}, {link.removeprefix('bw=')}: at least one compressor reaches fp32's "
             f"final accuracy minus 1 point in less than half fp32's time")
    ref = cs.get((task, link, "fp32"))
    mine = {w: c for (t, lk, w), c in cs.items()
            if (t, lk) == (task, link) and w not in ("fp32", "bf16", "bits4+ef")}
    if ref is None or not mine or not math.isfinite(ref.time):
        return claim, "-", None, "fp32 or the compressors not run at this size"
    timed = {w: c.time / ref.time for w, c in mine.items() if math.isfinite(c.time)}
    if not timed:
        return claim, "none reached the target", False, "every compressor missed it"
    best = min(timed, key=lambda w: timed[w])
    return (claim, f"fastest: {best}, {timed[best]:.2f}x fp32's time "
            f"({_s(mine[best].time)} vs {_s(ref.time)})", timed[best] < 0.5,
            "reached the target: " + ", ".join(f"{w} {r:.2f}x" for w, r in timed.items()))


def plot(out: Path, curves: list[Row], order: Sequence[str], title: str) -> str:
    panels = sorted(group(curves, "task", "link"))
    fig, axes = plots.figure(len(panels), width=4.5 * len(panels))
    for ax, (task, link) in zip(axes, panels):
        mine = [c for c in curves if (c["task"], c["link"]) == (task, link)]
        by_wire = group(mine, "wire")
        for (wire,) in sorted(by_wire, key=lambda k: _rank(order, k[0])):
            ax.plot(*time_curve(by_wire[(wire,)]), marker=".", label=wire,
                    linestyle="--" if wire in ("fp32", "bf16", "bits4+ef") else "-")
        plots.label(ax, "training time (s)", "test accuracy (%)",
                    f"{task}, {link.removeprefix('bw=')}", legend=ax is axes[0])
    plots.save(fig, out / "compressors.png", title)
    return "compressors.png"


def _task(name: str, spec: dict[str, Any]) -> str:
    """'mnist1d (mlp hidden 256 depth 3, batch 64, lr 0.05, 12 epochs; in fp32: *.bias)'."""
    model = " ".join(f"{k} {v}" if k != "name" else str(v) for k, v in spec["model"].items())
    return (f"{name} ({model}, batch {spec['data'].get('batch_size', '?')}, lr "
            f"{spec['optim'].get('lr', '?')}, {spec.get('epochs', '?')} epoch(s); in fp32: "
            f"{', '.join(spec.get('fp32', []))})")


def report(out: Path, meta: Meta, rows: list[Row], curves: list[Row], order: Sequence[str]
           ) -> str:
    """The report's body from the CSVs' rows and experiment.json's `meta`."""
    cs = cells(rows, curves)
    seeds = len(meta.get("seeds", [0]))
    png = plot(out, curves, order, f"compressors: accuracy vs time, 2 ranks, {seeds} seed(s)")
    tasks = "; ".join(_task(name, spec) for name, spec in meta.get("tasks", {}).items())
    return md.report(
        [f"Two data-parallel ranks per run, {seeds} seed(s). Tasks: {tasks}. A compressor "
         f"sends the parameters listed after 'in fp32' in fp32; signsgd runs at the task's "
         f"learning rate times {meta.get('sign_lr', '?')} (its update is the rate times +-1 "
         f"per value). Target: fp32's final accuracy minus {100 * TOLERANCE:.0f} point, per "
         f"task and link. Wires and compressors: docs/compressors.md.", result_table(cs, order)],
        [md.image(png, "test accuracy against training time, per task and link")],
        trend_rows(cs),
        "The papers train ImageNet and CIFAR-10 CNNs and LSTMs on GPUs with tuned schedules; "
        "here 2 CPU ranks train a 144 K-parameter MLP on MNIST-1D and a 137 K-parameter "
        "transformer for a few epochs, with plain SGD at one learning rate for every wire, "
        "behind links emulated in-process. What carries over is the ordering and whether a "
        "compressor keeps fp32's accuracy on an unsaturated task, not the papers' figures.",
        trends_title="The papers' claims")
