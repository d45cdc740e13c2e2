"""`approxdist simulate --fit` and `--time-to-accuracy`: fitted inputs and seed 001 Table 4.

    approxdist simulate --profile tests/data/pipedream-profiles/alexnet.txt --fit \\
        --time-to-accuracy

`--fit [NAMES]` fits the named inputs (default bandwidth_scale,jitter) to the points of
`--points` (default: seed 001's published s(N,b), `planner/simfit/tables`) with N <=
`--fit-max-nodes` and predicts the rest (`planner.simfit.fit`); `--time-to-accuracy
[FILE]` multiplies the model's s(N,b) by an epochs-to-accuracy curve (`--epochs FILE`, or
derived from the table and the points where their source publishes both) and prints the
verdict per row (`planner.simfit.accuracy`).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from approxdist.bench.report import Column, render
from approxdist.errors import ConfigError
from approxdist.planner.scaling import ScalingModel
from approxdist.planner.simfit.accuracy import published_curve, read_curve, time_to_accuracy
from approxdist.planner.simfit.fit import DEFAULT_FREE, fit
from approxdist.planner.simfit.points import (
    SEED001_SPEEDUP,
    SEED001_TIME_TO_ACCURACY,
    read_points,
    read_reached,
)
from approxdist.text import comma_list, name_list


def register(p: Any) -> None:
    p.add_argument("--fit", nargs="?", const=",".join(DEFAULT_FREE), metavar="NAMES",
                   help=f"fit these inputs to --points with N <= --fit-max-nodes and predict "
                        f"the rest (default {','.join(DEFAULT_FREE)})")
    p.add_argument("--points", type=Path, default=SEED001_SPEEDUP,
                   help="observed s(N,b): CSV nodes,per_node_batch,speedup (default: seed "
                        "001's published figures)")
    p.add_argument("--fit-max-nodes", type=int, default=64,
                   help="points with at most this many nodes are fitted (default 64)")
    p.add_argument("--predict", default="", metavar="N:b,...",
                   help="points to predict even with N <= --fit-max-nodes, e.g. 64:64")
    p.add_argument("--time-to-accuracy", nargs="?", const=SEED001_TIME_TO_ACCURACY, type=Path,
                   metavar="FILE", help="times to accuracy to reproduce (default: seed 001 "
                                        "Table 4)")
    p.add_argument("--epochs", type=Path, help="epochs-to-accuracy curve: CSV global_batch,"
                   "accuracy,epochs (default: derived from --time-to-accuracy and --points)")


FIT_COLUMNS = (Column("role", 9, "role", left=True), Column("nodes", 6, "nodes"),
               Column("b", 5, "per_node_batch"), Column("observed", 9, "observed", ".1f"),
               Column("s(N,b)", 8, "speedup", ".1f"),
               Column("error", 7, show=lambda r: f"{100 * r['error']:+.1f}%"),
               Column("fit band", 13, show=lambda r: f"{r['fit_low']:.1f}-{r['fit_high']:.1f}"),
               Column("band", 13, show=lambda r: f"{r['speedup_low']:.1f}-"
                                                 f"{r['speedup_high']:.1f}"))


def fitted(model: ScalingModel, args: argparse.Namespace) -> ScalingModel:
    """The model with `--fit`'s inputs fitted; prints the fit and predicted points."""
    table, points = read_points(args.points)
    free = name_list(args.fit)
    bad = ConfigError(f"--predict {args.predict!r} must be N:b pairs, e.g. 64:64,64:32")
    predict = comma_list(args.predict, _pair, bad) if args.predict else ()
    got = fit(model, points, free, args.fit_max_nodes, predict)
    print(f"fit of {', '.join(free)} on the points of {table.path.name} ({table.source}) "
          f"with N <= {args.fit_max_nodes}: rms error {100 * got.rms:.2f} % "
          f"({got.evals} evaluations)")
    for role in ("fit", "predicted"):
        rows = [r for r in got.rows if r["role"] == role]
        if rows:
            print(render(list(FIT_COLUMNS), rows))
    return got.model


def _pair(text: str) -> tuple[int, int]:
    nodes, batch = text.split(":")
    return int(nodes), int(batch)


TTA_COLUMNS = (Column("nodes", 6, "nodes"), Column("b", 4, "per_node_batch"),
               Column("batch", 6, "global_batch"), Column("acc %", 6, "accuracy", ".0f"),
               Column("step s", 7, show=lambda r: _x(r["step_speedup"])),
               Column("simulated", 10, show=lambda r: _x(r["simulated"])),
               Column("published", 10, show=lambda r: _x(r["published"])),
               Column("verdict", 40, "verdict", left=True))


def _x(value: object) -> str:
    return "-" if value is None or not math.isfinite(float(str(value))) else f"{value:.1f}x"


def report_time_to_accuracy(model: ScalingModel, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Seed 001 Table 4's rows (or `--time-to-accuracy FILE`'s) simulated, with verdicts."""
    table, reached = read_reached(args.time_to_accuracy)
    if args.epochs:
        curve = read_curve(args.epochs, model.profile.micro_batch_size)
        source = f"{args.epochs} (given)"
    else:
        curve = published_curve(reached, read_points(args.points)[1])
        source = f"derived from {table.path.name} and {args.points.name} ({table.source})"
    rows = time_to_accuracy(model, reached, curve)
    print(f"time to accuracy: S = s(N,b) x E({model.profile.micro_batch_size}, a) / E(Nb, a); "
          f"epochs-to-accuracy curve {source}")
    print(render(list(TTA_COLUMNS), rows))
    return rows
