"""`plan validate`'s report: the table of configurations, then the ex-ante figures (profiles
taken before the timed rounds), the in-round ones beside, and the rivals."""

from __future__ import annotations

import math
from typing import Any

from approxdist.bench.report import Column, render
from approxdist.planner.validation import report

COLUMNS = (Column("setting", 28, "setting", left=True), Column("plan", 34, "plan", left=True),
           Column("chosen by", 22, show=lambda r: ",".join(r["choosers"]), left=True),
           Column("ante ms", 9, show=lambda r: _ms(r.get("planned_s"))),
           Column("err", 6, show=lambda r: _err(r.get("planned_s"), r["measured_s"])),
           Column("round ms", 9, show=lambda r: _ms(r["predicted_s"])),
           Column("err", 6, show=lambda r: _err(r["predicted_s"], r["measured_s"])),
           Column("meas ms", 9, show=lambda r: _ms(r["measured_s"])))


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _err(predicted: float | None, measured: float) -> str:
    return "-" if predicted is None else f"{100 * (predicted / measured - 1):+.0f}%"


def _rivals(summary: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for who in ("torchgpipe", "pipedream"):
        if not any(who in r["choosers"] for r in rows):
            continue  # not a candidate here (the tensor-parallel settings)
        v = summary[f"vs_{who}"]
        if not v["differ"]:
            out.append(f"vs {who}: chose the same plan as ours in every setting")
            continue
        out.append(f"vs {who}: differs in {v['differ']} setting(s); ours measured faster in "
                   f"{v['ours_faster']}, median {v['median_speedup']:.2f}x its time per sample")
    return out


def print_report(rows: list[dict[str, Any]], which: str) -> dict[str, Any]:
    """Print the table and the figures of `rows` (`which`: the set of settings, as the
    titles name it); the summary, with `settings_set`."""
    print(render(COLUMNS, rows))
    summary = report.summarize(rows)
    head = summary.get("ex_ante", summary)
    print(f"{summary['configs_measured']} configurations in {summary['settings']} {which} "
          f"settings; Kendall's tau within settings {head['kendall_tau_within']:.2f} "
          f"({'ex ante' if 'ex_ante' in summary else 'in the rounds'}), worst regret "
          f"{100 * summary['max_regret']:.1f} %")
    for title, figures in (("ex ante: each plan priced on the profile it was chosen on, "
                            "taken before the timed rounds, at its load factor (a probe "
                            "before any step)",
                            summary.get("ex_ante")),
                           ("in the rounds: priced on the profile taken in each timed round, "
                            "at its load factor (beside)", summary)):
        if figures is None:
            continue
        print(f"{title}; {which} settings:")
        for key, text, met in report.verdicts(figures):
            print(f"  {key:12s} {text}: {'met' if met else 'NOT met'}")
        print(f"  {'bias':12s} signed median {100 * figures['median_signed']:+.1f} %, "
              f"{figures['under']} of {summary['configs_measured']} predicted faster")
    if "ex_ante_alone" in summary:
        alone = summary["ex_ante_alone"]
        print(f"ex ante without the load factors (the profile alone): median APE "
              f"{100 * alone['median_ape']:.1f} %, tau {alone['kendall_tau']:.2f}, signed "
              f"median {100 * alone['median_signed']:+.1f} %")
    modes = summary["bias_by_mode"]
    print("bias by mode (signed median, ex ante / in the rounds): " + "; ".join(
        f"{m} ({v['count']}) " + (f"{100 * v['ex_ante']:+.1f} % / " if "ex_ante" in v else "")
        + f"{100 * v['in_round']:+.1f} %" for m, v in modes.items()))
    if "drift" in summary:
        d = summary["drift"]
        print(f"machine drift (a pass alone in the rounds over before them, per setting): "
              f"median x{d['median']:.3f}, x{d['min']:.3f} .. x{d['max']:.3f}")
    for line in _rivals(summary, rows):
        print(f"  {line}")
    return {**summary, "settings_set": which}


def finite(value: Any) -> Any:
    """`value` with every NaN (a figure with too few configurations) as null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
