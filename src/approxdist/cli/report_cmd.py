"""`approxdist report DIR`: regenerate the plots and report.md of an experiment from its CSVs.

    approxdist report exp/bits      # one experiment directory
    approxdist report exp           # every experiment directory directly under exp/

Nothing is re-run: the preset named in DIR/experiment.json reads its CSV files and
writes its PNG plots and report.md again (after editing a CSV, or a newer report).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from approxdist.cli.groups import command
from approxdist.errors import DataError
from approxdist.experiments import render_report
from approxdist.experiments.runner import META_FILE


def register(sub: Any) -> None:
    p = command(sub, "report", help="regenerate an experiment's plots and report from its CSVs", doc=__doc__)
    p.add_argument("dir", type=Path, metavar="DIR",
                   help="an experiment directory (holds experiment.json), or a folder of them")
    p.set_defaults(func=run)


def experiment_dirs(path: Path) -> list[Path]:
    """`path` itself if it is an experiment directory, else its experiment subdirectories."""
    if (path / META_FILE).is_file():
        return [path]
    subs = sorted(d for d in path.iterdir() if (d / META_FILE).is_file()) if path.is_dir() else []
    if not subs:
        raise DataError(f"{str(path)!r} holds no {META_FILE}; pass the --out directory of "
                        f"`approxdist experiment NAME --out DIR`")
    return subs


def run(args: argparse.Namespace) -> int:
    for path in experiment_dirs(args.dir):
        print(f"report written: {render_report(path)}")
    return 0
