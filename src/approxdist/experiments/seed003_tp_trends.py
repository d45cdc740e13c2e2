"""The checked claims of `seed003-tp`, per task, each verdict computed from the run.

- Bian et al. (MLSys 2024), "compressing model-parallel activations often hurts more
  than it helps": holds when at least half of the formats on the TP forward wire lose
  more than BUDGET (1 point) of final accuracy against fp32.
- Rudakov et al. (2024), "gradients tolerate less compression than activations": holds
  when the formats' mean change on the backward wire is below their mean on the forward
  wire (the same formats, no error feedback).
- Rudakov et al. (2024), "error feedback does not help model-parallel training": holds
  when error feedback gains at most BUDGET on average over every (wire, format) pair.
- Issue 33's question, "within a layer or between layers": approximation costs less
  between layers when the formats' mean change on a pipeline cut is above their mean on
  the TP forward wire.
- Issue 33's figure: at an emulated 100 Mbit/s link some bf16 or 8-bit forward wire
  makes the TP step >= SPEEDUP x faster than fp32 and loses at most BUDGET.
"""

from __future__ import annotations

import math
import statistics

from approxdist.experiments import markdown as md
from approxdist.experiments.csvio import Row
from approxdist.experiments.seed003_tp_report import BUDGET, Finals, change, codecs_of

#: the target: the forward wire's speed-up of a TP step over fp32 at 100 Mbit/s
SPEEDUP = 1.6
Place = tuple[str, str, int]  # parallel mode, wire direction, error feedback
FWD: Place = ("tensor", "fwd", 0)
BWD: Place = ("tensor", "bwd", 0)
PIPE: Place = ("pipeline", "fwd", 0)


def trend_rows(fin: Finals, links: list[Row], tasks: list[str]) -> list[md.Trend]:
    """Every claim, for every task."""
    out: list[md.Trend] = []
    for task in tasks:
        out += [bian(fin, task), gradients(fin, task), feedback(fin, task),
                layer_or_cut(fin, task), link_figure(fin, links, task)]
    return out


def changes(fin: Finals, task: str, place: Place) -> dict[str, float]:
    """Codec -> accuracy change at `place`, the measured ones only."""
    found = {c: change(fin, task, place, c) for c in codecs_of(fin, task)}
    return {c: v for c, v in found.items() if math.isfinite(v)}


def _listed(values: dict[str, float]) -> str:
    return ", ".join(f"{c} {md.points(v)}" for c, v in values.items()) or "none"


def bian(fin: Finals, task: str) -> md.Trend:
    claim = (f"{task}: Bian et al. (MLSys 2024): compressing model-parallel activations "
             f"often hurts more than it helps (here: at least half of the formats on the TP "
             f"forward wire lose more than {100 * BUDGET:.0f} point)")
    fwd = changes(fin, task, FWD)
    if not fwd:
        return claim, "-", None, "no format ran on the forward wire"
    hurt = {c: v for c, v in fwd.items() if v < -BUDGET}
    within = {c: v for c, v in fwd.items() if c not in hurt}
    ok = 2 * len(hurt) >= len(fwd)
    return (claim, f"{len(hurt)} of {len(fwd)} lose more: {_listed(fwd)}", ok,
            md.join(f"within a point: {', '.join(within) or 'none'}", md.why(
                ok, "", "they cut the forward wire's bytes to their bits / 32 at no accuracy cost")))


def gradients(fin: Finals, task: str) -> md.Trend:
    claim = (f"{task}: Rudakov et al. (2024): gradients tolerate less compression than "
             "activations (here: the same formats lose more on the TP backward wire than "
             "on the forward wire, mean over formats)")
    return costs_more(fin, task, claim, (BWD, "backward"), (FWD, "forward"), "")


def feedback(fin: Finals, task: str) -> md.Trend:
    claim = (f"{task}: Rudakov et al. (2024): error feedback does not help model-parallel "
             f"training (here: it gains at most {100 * BUDGET:.0f} point on average over "
             "the formats on both TP wires)")
    gains: dict[str, float] = {}
    for direction in ("fwd", "bwd"):
        off = changes(fin, task, ("tensor", direction, 0))
        on = changes(fin, task, ("tensor", direction, 1))
        gains.update({f"{c} {direction}": on[c] - off[c] for c in off if c in on})
    if not gains:
        return claim, "-", None, "no format ran with and without error feedback"
    mean = statistics.fmean(gains.values())
    best = max(gains, key=lambda k: gains[k])
    ok = mean <= BUDGET
    return (claim, f"mean gain {md.points(mean)} over {len(gains)} (format, wire) pairs", ok,
            md.join(md.why(ok, "", "error feedback recovers what the formats lose"),
                    f"the largest gain: {best} {md.points(gains[best])}"))


def layer_or_cut(fin: Finals, task: str) -> md.Trend:
    claim = (f"{task}: seed 003's splits: the same formats cost less between "
             "layers (a pipeline cut's activations) than within a layer (the TP forward "
             "wire), mean over formats")
    per_step = {p: fin.get((task, p, "-", "fp32", 0), {}).get("bytes_per_step", math.nan)
                for p in ("tensor", "pipeline")}
    return costs_more(fin, task, claim, (FWD, "TP forward"), (PIPE, "pipeline cut"),
                      f"fp32 bytes per step: TP {per_step['tensor'] / 1e6:.3f} MB (every "
                      f"split layer, both directions), pipeline "
                      f"{per_step['pipeline'] / 1e6:.3f} MB (one cut)")


def costs_more(fin: Finals, task: str, claim: str, dear: tuple[Place, str],
               cheap: tuple[Place, str], note: str) -> md.Trend:
    """Holds when the formats run at both places lose more, on average, at `dear`
    (a place and its name) than at `cheap`."""
    a, b = changes(fin, task, dear[0]), changes(fin, task, cheap[0])
    both = [c for c in a if c in b]
    if not both:
        return claim, "-", None, f"no format ran both on the {dear[1]} and {cheap[1]} wires"
    mean_a = statistics.fmean(a[c] for c in both)
    mean_b = statistics.fmean(b[c] for c in both)
    worse = [c for c in both if a[c] < b[c]]
    return (claim, f"mean change: {dear[1]} {md.points(mean_a)}, {cheap[1]} "
                   f"{md.points(mean_b)}", mean_a < mean_b,
            md.join(f"{dear[1]} lost more for {len(worse)} of {len(both)} formats "
                    f"({', '.join(worse) or 'none'}): {_listed(a)}", note))


def link_figure(fin: Finals, links: list[Row], task: str) -> md.Trend:
    claim = (f"{task}: approxdist's target: at an emulated 100 Mbit/s link a bf16 or 8-bit forward "
             f"wire makes the TP step >= {SPEEDUP}x faster than fp32, final accuracy "
             f"within {100 * BUDGET:.0f} point")
    mine = {str(r["codec"]): r for r in links if r["task"] == task}
    if "fp32" not in mine or len(mine) < 2:
        return claim, "-", None, "no fp32 and lossy forward wire timed through the link"
    base = mine.pop("fp32")
    speed = {c: float(base["step_time_s"]) / float(r["step_time_s"]) for c, r in mine.items()}
    delta = {c: change(fin, task, FWD, c) for c in mine}
    fast = [c for c in mine if speed[c] >= SPEEDUP]
    meets = [c for c in fast if delta[c] >= -BUDGET]
    unknown = [c for c in fast if not math.isfinite(delta[c])]
    ok = True if meets else (None if unknown else False)
    fewer = {c: float(base["bytes_per_step"]) / float(r["bytes_per_step"])
             for c, r in mine.items()}
    best = max(speed, key=lambda c: speed[c])
    ours = ", ".join(f"{c}: {speed[c]:.2f}x, {md.points(delta[c])}" for c in mine)
    if ok:
        why = f"{', '.join(meets)} meet(s) both"
    elif fast:
        why = (f"fast enough: {', '.join(fast)}; "
               f"{'no accuracy run of it' if unknown else 'but each loses more than a point'}")
    else:
        why = (f"the fastest, {best}, cuts the bytes per step {fewer[best]:.2f}x (the "
               f"backward wire stays fp32) and the step {speed[best]:.2f}x; a step speeds "
               f"up at most as much as its bytes fall, less what compute and the codec take")
    return claim, ours, ok, why
