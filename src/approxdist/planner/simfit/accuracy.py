"""Time to accuracy at scale: simulated step times x an epochs-to-accuracy curve (seed 001 Table 4).

Training to accuracy a on N nodes at per-node batch b takes E(Nb, a) epochs of D / (Nb)
steps of t(N, b) seconds each (D: the data set's samples). Against one node at the
reference batch B (seed 001: B = 256) the speed-up is

    S(N, b, a) = T(1, B, a) / T(N, b, a) = s(N, b) x E(B, a) / E(Nb, a)

with s(N, b) the step-time speed-up (seed 001, eq. 1) the simulator predicts. The curve
E(global batch, a) is an input, labelled with its source: a user's file (`global_batch,
accuracy, epochs`, empty epochs where the run never reached a; epochs only matter as
ratios to the reference batch's) or, from a published table of times to accuracy, the
ratio E(B, a) / E(Nb, a) = S_published(N, b, a) / s_published(N, b) wherever the same
source also publishes the step-time speed-up s(N, b) (seed 001: only at N = 64, b = 64),
and "never" where the table says the accuracy was not reached. A row whose curve needs a
step time the source does not publish gets no check: deriving it from our own s(N, b)
would reproduce the table by construction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from approxdist.errors import DataError
from approxdist.planner.scaling import ScalingModel
from approxdist.planner.simfit.points import Point, Reached, read_table

#: a time-to-accuracy speed-up within this share of the published one is reproduced
WITHIN = 0.20
Curve = Mapping[tuple[int, float], float]  # (global batch, accuracy) -> E(B_ref, a) / E(., a)


def published_curve(reached: Sequence[Reached], points: Sequence[Point]) -> dict[
        tuple[int, float], float]:
    """E(B, a) / E(global batch, a) (inf: never reached) from a time-to-accuracy table and
    the step-time speed-ups the same source publishes."""
    steps = {(p.nodes, p.per_node_batch): p.speedup for p in points}
    out: dict[tuple[int, float], float] = {}
    for r in reached:
        key = (r.nodes * r.per_node_batch, r.accuracy)
        if math.isinf(r.seconds):
            out[key] = math.inf
        elif r.nodes == 1:
            out[key] = 1.0
        elif (r.nodes, r.per_node_batch) in steps and math.isfinite(r.speedup):
            out[key] = r.speedup / steps[(r.nodes, r.per_node_batch)]
    return out


def read_curve(path: Path, reference_batch: int) -> dict[tuple[int, float], float]:
    """A user's epochs-to-accuracy file as E(B, a) / E(reference batch, a) (inf: never)."""
    table = read_table(path, ("global_batch", "accuracy", "epochs"))
    epochs: dict[tuple[int, float], float] = {}
    for i, r in enumerate(table.rows, 1):
        try:
            key = (int(r["global_batch"]), float(r["accuracy"]))
            epochs[key] = float(r["epochs"]) if r["epochs"].strip() else math.inf
        except ValueError:
            raise DataError(f"epochs file {str(path)!r} row {i}: {dict(r)} must hold a whole "
                            f"global_batch, an accuracy and epochs (empty: never reached)") from None
        if not epochs[key] > 0:
            raise DataError(f"epochs file {str(path)!r} row {i}: epochs = {r['epochs']} must be "
                            f"> 0 (empty: never reached)")
    out = {}
    for (batch, acc), e in epochs.items():
        ref = epochs.get((reference_batch, acc))
        if ref is None or math.isinf(ref):
            raise DataError(f"epochs file {str(path)!r} has no finite epochs at the reference "
                            f"batch {reference_batch} for accuracy {acc:g}; add that row")
        out[(batch, acc)] = ref / e if math.isfinite(e) else math.inf
    return out


def time_to_accuracy(model: ScalingModel, reached: Sequence[Reached], curve: Curve
                     ) -> list[dict[str, object]]:
    """One row per table row but the reference's: the simulated speed-up to its accuracy
    and the verdict against the published one."""
    rows: list[dict[str, object]] = []
    for r in reached:
        if r.nodes == 1:
            continue
        key = (r.nodes * r.per_node_batch, r.accuracy)
        ratio = curve.get(key)
        seed_never = math.isinf(r.seconds)
        row: dict[str, object] = {"nodes": r.nodes, "per_node_batch": r.per_node_batch,
                                  "global_batch": key[0], "accuracy": r.accuracy,
                                  "published": None if seed_never else r.speedup,
                                  "simulated": None, "step_speedup": None}
        if ratio is None:
            row["verdict"] = (f"no check: no epochs to {r.accuracy:g} % at global batch "
                              f"{key[0]} (its source publishes no step time at N={r.nodes}, "
                              f"b={r.per_node_batch})")
        elif math.isinf(ratio):
            row["verdict"] = "never reaches it; published: " + (
                "never (reproduced)" if seed_never else f"{r.speedup:g}x (not reproduced)")
        else:
            s = model.speedup(r.nodes, r.per_node_batch)
            sim = s * ratio
            row.update(simulated=sim, step_speedup=s)
            if seed_never:
                row["verdict"] = f"{sim:.1f}x; published: never (not reproduced)"
            else:
                err = sim / r.speedup - 1
                ok = abs(err) <= WITHIN
                row["verdict"] = (f"{err:+.0%}: {'reproduced' if ok else 'not reproduced'} "
                                  f"(within {WITHIN:.0%}: {'yes' if ok else 'no'})")
        rows.append(row)
    return rows
