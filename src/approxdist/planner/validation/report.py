"""What `plan validate` concludes from its rows (pure): errors, order, regret, rivals.

A row is one configuration (a setting x a plan) with `predicted_s` and `measured_s` (one
step), the samples a step trains, who chose the plan (`choosers`) and its `setting`;
optionally `planned_s`, its price on the profile the plans were chosen on, taken before
the timed rounds as a user's `approxdist plan` has it: the *ex-ante* figures (where
`predicted_s` prices it on a profile taken while it was timed: the *in-round* figures;
`planned_alone_s` on the ex-ante profile alone, without its load factors), and `drift`,
the machine's speed in the rounds over before them (a pass alone, per setting).
Plans with more micro-batches train more samples per step, so orders and choices are
compared on seconds per sample, as the planner ranks them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from approxdist.planner.validation.metrics import ape, kendall_tau, median, regret

Row = Mapping[str, Any]

#: the targets (fractions): median and max APE, Kendall's tau, regret
TARGETS = {"median_ape": 0.15, "max_ape": 0.35, "kendall_tau": 0.8, "regret": 0.10}


def per_sample(row: Row, key: str) -> float:
    return float(row[key]) / int(row["samples_per_step"])


def by_setting(rows: Sequence[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for r in rows:
        out.setdefault(str(r["setting"]), []).append(r)
    return out


def chosen_by(rows: Sequence[Row], who: str) -> Row | None:
    return next((r for r in rows if who in r["choosers"]), None)


def figures(rows: Sequence[Row], key: str) -> dict[str, float]:
    """`median_ape`, `max_ape`, `kendall_tau` (every configuration, seconds per sample),
    `kendall_tau_within` (mean over settings) of the prices in `key` against `measured_s`,
    and the bias: `median_signed` (of predicted / measured - 1) and `under` (how many
    configurations were predicted faster than measured)."""
    errors = [ape(float(r[key]), float(r["measured_s"])) for r in rows]
    signed = [float(r[key]) / float(r["measured_s"]) - 1 for r in rows]
    within: list[float] = []
    for group in by_setting(rows).values():
        if len(group) >= 2:
            t = kendall_tau([per_sample(r, key) for r in group],
                            [per_sample(r, "measured_s") for r in group])
            if not math.isnan(t):
                within.append(t)
    return {"median_ape": median(errors), "max_ape": max(errors),
            "kendall_tau": kendall_tau([per_sample(r, key) for r in rows],
                                       [per_sample(r, "measured_s") for r in rows]),
            "kendall_tau_within": sum(within) / len(within) if within else math.nan,
            "median_signed": median(signed), "under": sum(e < 0 for e in signed)}


def summarize(rows: Sequence[Row]) -> dict[str, Any]:
    """The figures of the validation: the in-round `figures` of `predicted_s` at the top,
    `regret` (mean over settings) and `max_regret` of the chosen plan, and the rivals'
    measured times; where every row has `planned_s`, `ex_ante` holds its `figures` and
    the same regret (the plans are chosen on that profile either way)."""
    regrets: list[dict[str, Any]] = []
    rivals: dict[str, list[dict[str, Any]]] = {"torchgpipe": [], "pipedream": []}
    for setting, group in by_setting(rows).items():
        ours = chosen_by(group, "ours")
        if ours is None:
            continue
        mine = per_sample(ours, "measured_s")
        regrets.append({"setting": setting, "regret": regret(
            mine, [per_sample(r, "measured_s") for r in group])})
        for who, out in rivals.items():
            theirs = chosen_by(group, who)
            if theirs is not None and theirs is not ours:
                out.append({"setting": setting, "ours_s": mine,
                            "theirs_s": per_sample(theirs, "measured_s"),
                            "speedup": per_sample(theirs, "measured_s") / mine})
    losses = [float(r["regret"]) for r in regrets]
    regret_figures = {"regret": sum(losses) / len(losses) if losses else math.nan,
                      "max_regret": max(losses, default=math.nan)}
    summary: dict[str, Any] = {
        "configs_measured": len(rows), "settings": len(by_setting(rows)),
        **figures(rows, "predicted_s"), **regret_figures, "regret_by_setting": regrets}
    if rows and all("planned_s" in r for r in rows):
        summary["ex_ante"] = {**figures(rows, "planned_s"), **regret_figures}
    if rows and all("planned_alone_s" in r for r in rows):
        summary["ex_ante_alone"] = figures(rows, "planned_alone_s")
    summary["bias_by_mode"] = bias_by_mode(rows)
    drifts = [float(g[0]["drift"]) for g in by_setting(rows).values() if "drift" in g[0]]
    if drifts:
        summary["drift"] = {"median": median(drifts), "min": min(drifts), "max": max(drifts)}
    for who, out in rivals.items():
        speedups = [r["speedup"] for r in out]
        summary[f"vs_{who}"] = {
            "differ": len(out), "ours_faster": sum(s > 1 for s in speedups),
            "median_speedup": median(speedups) if speedups else math.nan, "by_setting": out}
    return summary


def bias_by_mode(rows: Sequence[Row]) -> dict[str, dict[str, float]]:
    """Per mode (dp, pipeline, hybrid, ...): how many configurations and the signed median
    error of the in-round prices (`in_round`) and, where the rows have them, the ex-ante
    ones (`ex_ante`): which kind of plan the model prices short."""
    modes: dict[str, list[Row]] = {}
    for r in rows:
        modes.setdefault(str(r.get("mode", "-")), []).append(r)
    out: dict[str, dict[str, float]] = {}
    for mode, group in sorted(modes.items()):
        out[mode] = {"count": len(group), "in_round": median(
            [float(r["predicted_s"]) / float(r["measured_s"]) - 1 for r in group])}
        if all("planned_s" in r for r in group):
            out[mode]["ex_ante"] = median(
                [float(r["planned_s"]) / float(r["measured_s"]) - 1 for r in group])
    return out


def verdicts(summary: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """(figure, measured vs target, met) for each of the held-out figures' targets (`summary`: the
    in-round figures at its top, or its `ex_ante`)."""
    out = []
    for key, target in TARGETS.items():
        value = float(summary[key])
        met = value >= target if key == "kendall_tau" else value <= target
        sign = ">=" if key == "kendall_tau" else "<="
        shown = f"{value:.2f}" if key == "kendall_tau" else f"{100 * value:.1f} %"
        goal = f"{target:.2f}" if key == "kendall_tau" else f"{100 * target:.0f} %"
        out.append((key, f"{shown} (target {sign} {goal})", met and not math.isnan(value)))
    return out
