"""Why a plan was chosen: the best plan of each mode, where its step goes, and the margins (pure text).

`approxdist plan` ranks pipelines, hybrids, data and tensor parallelism by predicted
seconds per sample; `explain` says what that ranking rests on, one line per mode (its
best plan, its time per sample and the parts of its step: compute, bubble, all-reduces,
the tensor-parallel collectives with their count and bytes), the modes not priced and
why, and how much faster the chosen plan is predicted than each other mode's best.
"""

from __future__ import annotations

from collections.abc import Sequence

from approxdist.planner.search import RankedPlan


def label(p: RankedPlan) -> str:
    """A plan in a few words: `tp=2,dp=2`, `dp=4`, `1f1b M=8 [0,3)x1 [3,7)x2` (its kind's
    label, `planner.kinds`)."""
    return p.kind.label(p.plan, p.tp)


def parts_text(p: RankedPlan) -> str:
    """Its step's parts: seconds in ms, shares as fractions, counts and bytes as such."""
    out = []
    for key, value in p.parts.items():
        name = key.removesuffix("_s").removesuffix("_bytes").replace("_", " ")
        if key.endswith("_s"):
            out.append(f"{name} {value * 1e3:.1f} ms")
        elif key.endswith("_bytes"):
            out.append(f"{name} {value / 1024:.1f} KiB")
        elif isinstance(value, int):
            out.append(f"{name} {value}")
        else:
            out.append(f"{name} {value:.2f}")
    return ", ".join(out)


def explain(ranked: Sequence[RankedPlan], not_priced: Sequence[str] = ()) -> list[str]:
    """Lines saying why `ranked[0]` (the fastest per sample) was chosen."""
    best: dict[str, RankedPlan] = {}
    for p in ranked:
        best.setdefault(p.mode, p)
    lines = ["why: the best plan of each mode, per sample, and where its step goes"]
    width = max(len(label(p)) for p in best.values())
    for mode, p in best.items():
        lines.append(f"  {mode:8s} {label(p):{width}s} {p.per_sample_s * 1e6:10.1f} us/sample"
                     f"  {parts_text(p)}")
    lines += [f"  not priced: {why}" for why in not_priced]
    chosen = ranked[0]
    margins = [f"{p.per_sample_s / chosen.per_sample_s:.2f}x {mode}"
               for mode, p in best.items() if mode != chosen.mode]
    lines.append(f"chosen: {chosen.mode} {label(chosen)}"
                 + (f", faster per sample than the best of each other mode by "
                    f"{', '.join(margins)}" if margins else ", the only mode priced"))
    return lines
