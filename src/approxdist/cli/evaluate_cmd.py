"""`approxdist evaluate RUN`: score a finished run's checkpoint on its test set, at any `tp`.

    approxdist evaluate runs/tp2            # the shards merged, one process
    approxdist evaluate runs/tp2 --tp 4     # resharded: split again over 4 ranks

A tensor-parallel run's checkpoint is one file per shard; evaluate merges them into the
whole model and scores it whole or split again at another `tp` size (the run's plan;
exact collectives). A data-parallel run's checkpoint can be scored split the same way.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from approxdist.cli.groups import command
from approxdist.train.evaluate import evaluate_run


def register(sub: Any) -> None:
    p = command(sub, "evaluate", help="score a run's checkpoint on its test set at any tp size", doc=__doc__)
    p.add_argument("run", type=Path, metavar="RUN",
                   help="the --out directory of a data- or tensor-parallel `approxdist train` run")
    p.add_argument("--tp", type=int, default=1, metavar="N",
                   help="split the model over N local ranks by the run's plan (default 1: "
                        "one process)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    scored = evaluate_run(args.run, args.tp)
    how = "one process" if args.tp == 1 else f"tp {args.tp}"
    print(f"approxdist: {args.run} (tp {scored.saved_tp}, epoch {scored.epoch}) on {how}: "
          f"test accuracy {scored.accuracy:.4f}, test loss {scored.loss:.4f}")
    return 0
