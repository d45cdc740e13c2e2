"""seed004-adaprec's Pareto view: each policy a point (time, accuracy) with its spread over
seeds, the verdict whether a fixed policy dominates AdaPrec, and AdaPrec's choices per
parameter over the steps.

A fixed policy dominates an AdaPrec variant when it is both more accurate beyond the seeds'
spread (its mean minus its standard deviation above AdaPrec's mean plus AdaPrec's) and
faster (a lower mean wall time). One seed has no spread: then any higher mean counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from approxdist.adaptive.per_layer import MIX, mix_rules
from approxdist.experiments import markdown as md
from approxdist.experiments import plots
from approxdist.experiments.csvio import Row, group, spread


@dataclass(frozen=True)
class Point:
    """One policy over its seeds: mean and standard deviation of time and accuracy."""

    policy: str
    time: float
    time_sd: float
    acc: float
    acc_sd: float
    n: int


def points(rows: list[Row]) -> dict[str, Point]:
    out = {}
    for (policy,), mine in group(rows, "policy").items():
        t = spread([float(r["wall_time_s"]) for r in mine])
        a = spread([float(r["final_accuracy"]) for r in mine])
        out[str(policy)] = Point(str(policy), t["mean"], _sd(t), a["mean"], _sd(a), len(mine))
    return out


def _sd(stats: dict[str, float]) -> float:
    """The standard deviation, 0 for one seed (no spread measured)."""
    sd = stats["std"]
    return sd if sd == sd else 0.0


def dominates(fixed: Point, ada: Point) -> bool:
    """Whether `fixed` is more accurate beyond the spread and faster than `ada`."""
    return fixed.acc - fixed.acc_sd > ada.acc + ada.acc_sd and fixed.time < ada.time


def verdict(pts: dict[str, Point], adaptive: str, fixed: tuple[str, ...]) -> list[str]:
    """The fixed policies that dominate `adaptive` (empty: none does)."""
    ada = pts[adaptive]
    return [p for p in fixed if p in pts and dominates(pts[p], ada)]


def pareto_table(pts: dict[str, Point], adaptive: tuple[str, ...],
                 fixed: tuple[str, ...]) -> str:
    t_float = pts["float"].time if "float" in pts else float("nan")
    body = []
    for p in pts.values():
        over = [a for a in adaptive if a in pts and p.policy in fixed and dominates(p, pts[a])]
        body.append((p.policy, f"{p.time:.1f} ± {p.time_sd:.1f}", f"{p.time / t_float:.2f}x",
                     md.pct_spread({"mean": p.acc, "std": p.acc_sd, "n": p.n}),
                     ", ".join(over) if over else "-"))
    return md.table(("policy", "wall time (s)", "vs float", "final test accuracy",
                     "dominates"), body)


def choices(chosen: list[tuple[int, str]]) -> tuple[list[str], list[int], list[list[str]]]:
    """(parameters, boundary steps, codec per parameter per boundary) of one run's choices;
    one row `all` where no boundary chose a codec per parameter."""
    names = list(dict.fromkeys(r.split("=", 1)[0] for _, c in chosen if c.startswith(MIX)
                               for r in mix_rules(c)))
    rows = names or ["all"]
    grid = []
    for _, codec in chosen:
        per = dict(r.split("=", 1) for r in mix_rules(codec)) if codec.startswith(MIX) else {}
        grid.append([per.get(n, codec) for n in rows])
    return rows, [s for s, _ in chosen], grid


def plot_pareto(out: Path, pts: dict[str, Point], adaptive: tuple[str, ...],
                runs: dict[str, list[tuple[int, str]]], codecs: tuple[str, ...],
                title: str) -> str:
    """adaprec-pareto.png: the points with their spread, and each AdaPrec variant's codec
    per parameter over the steps (its first seed)."""
    fig, axes = plots.figure(1 + len(runs), width=5.5 * (1 + len(runs)))
    ax = axes[0]
    for p in pts.values():
        ax.errorbar([p.time], [100 * p.acc], xerr=[p.time_sd], yerr=[100 * p.acc_sd],
                    marker="*" if p.policy in adaptive else "o", capsize=3, label=p.policy)
    plots.label(ax, "wall time (s)", "final test accuracy (%)", "time vs accuracy (±1 sd)")
    order = list(codecs)
    for ax, (label, chosen) in zip(axes[1:], runs.items()):
        names, steps, grid = choices(chosen)
        for codec in (c for row in grid for c in row):
            if codec not in order:
                order.append(codec)
        for i, name in enumerate(names):
            ax.step(steps, [order.index(row[i]) + 0.08 * i for row in grid], where="post",
                    marker=".", label=name)
        ax.set_yticks(range(len(order)), order)
        plots.label(ax, "step", "codec", f"{label}: codec per parameter",
                    legend=len(names) <= 12)
    plots.save(fig, out / "adaprec-pareto.png", title)
    return "adaprec-pareto.png"
