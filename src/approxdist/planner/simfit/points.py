"""Observed speed-ups and times to accuracy: labelled tables (`# key: value` lines, then CSV).

A speed-up table has columns `nodes, per_node_batch, speedup` (seed 001's eq. 1: s(N,b)
against one node at the reference batch); a time-to-accuracy table `nodes,
per_node_batch, accuracy, train_time, speedup` (`h:mm`, or seconds; empty where the
accuracy was not reached). Lines `# source: ...` and `# dataset_samples: N` label them.
Seed 001's published figures ship as `tables/seed001_speedup.csv` and
`tables/seed001_time_to_accuracy.csv`; a user's own points file has the same form.
A point outside the model's domain (N < 1, b < 1, a global batch larger than the data
set, a speed-up <= 0) is refused with its file and row.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from approxdist.errors import DataError

TABLES = Path(__file__).parent / "tables"
SEED001_SPEEDUP = TABLES / "seed001_speedup.csv"
SEED001_TIME_TO_ACCURACY = TABLES / "seed001_time_to_accuracy.csv"
SPEEDUP_COLUMNS = ("nodes", "per_node_batch", "speedup")
TTA_COLUMNS = ("nodes", "per_node_batch", "accuracy", "train_time", "speedup")


@dataclass(frozen=True)
class Point:
    """One observed s(N, b)."""

    nodes: int
    per_node_batch: int
    speedup: float


@dataclass(frozen=True)
class Reached:
    """One row of a time-to-accuracy table: seconds to `accuracy` % (inf: not reached)."""

    nodes: int
    per_node_batch: int
    accuracy: float
    seconds: float
    speedup: float  # nan where not reached


@dataclass(frozen=True)
class Table:
    path: Path
    source: str
    dataset_samples: int | None
    rows: tuple[dict[str, str], ...]


def read_table(path: Path, columns: tuple[str, ...]) -> Table:
    """The `# key: value` labels and the CSV rows of `path` (every column in `columns`)."""
    if not path.is_file():
        raise DataError(f"points file {str(path)!r} not found; give a CSV with columns "
                        f"{', '.join(columns)} (e.g. {SEED001_SPEEDUP.name})")
    lines = path.read_text().splitlines()
    labels = dict(line[1:].split(":", 1) for line in lines if line.startswith("#") and ":" in line)
    labels = {k.strip(): v.strip() for k, v in labels.items()}
    reader = csv.DictReader([line for line in lines if line and not line.startswith("#")])
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise DataError(f"points file {str(path)!r} lacks column(s) {', '.join(missing)}; "
                        f"its header must name {', '.join(columns)}")
    samples = labels.get("dataset_samples")
    try:
        size = int(samples) if samples else None
    except ValueError:
        raise DataError(f"points file {str(path)!r}: dataset_samples {samples!r} must be a "
                        f"whole number") from None
    return Table(path, labels.get("source", "given"), size, tuple(reader))


def _number(table: Table, row: int, key: str, text: str, kind: type = float) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise DataError(f"points file {str(table.path)!r} row {row}: {key} = {text!r} is not "
                        f"a number; fix the row") from None
    return float(value)


def _domain(table: Table, row: int, cells: dict[str, str]) -> tuple[int, int]:
    """The row's (N, b), refused outside the model's domain."""
    nodes = _number(table, row, "nodes", cells["nodes"], int)
    batch = _number(table, row, "per_node_batch", cells["per_node_batch"], int)
    where = f"points file {str(table.path)!r} row {row}"
    if nodes < 1:
        raise DataError(f"{where}: nodes = {nodes:g} is outside the model's domain (N >= 1: "
                        f"s(N,b) is against one node); fix or drop the row")
    if batch < 1:
        raise DataError(f"{where}: per_node_batch = {batch:g} must be >= 1; fix the row")
    if table.dataset_samples is not None and nodes * batch > table.dataset_samples:
        raise DataError(f"{where}: global batch {nodes:g} x {batch:g} = {nodes * batch:g} is "
                        f"larger than the data set ({table.dataset_samples} samples, "
                        f"# dataset_samples); use a smaller per_node_batch or fewer nodes")
    return int(nodes), int(batch)


def read_points(path: Path) -> tuple[Table, tuple[Point, ...]]:
    """The speed-up points of `path`."""
    table = read_table(path, SPEEDUP_COLUMNS)
    points = []
    for i, r in enumerate(table.rows, 1):
        n, b = _domain(table, i, r)
        s = _number(table, i, "speedup", r["speedup"])
        if not s > 0:
            raise DataError(f"points file {str(path)!r} row {i}: speedup = {s:g} must be > 0; "
                            f"fix the row")
        points.append(Point(n, b, s))
    return table, tuple(points)


def seconds(text: str) -> float:
    """`h:mm` or seconds as seconds; inf for an empty cell (not reached)."""
    if not text.strip():
        return math.inf
    if ":" in text:
        hours, minutes = text.split(":")
        return 3600 * int(hours) + 60 * int(minutes)
    return float(text)


def read_reached(path: Path) -> tuple[Table, tuple[Reached, ...]]:
    """The time-to-accuracy rows of `path`."""
    table = read_table(path, TTA_COLUMNS)
    out = []
    for i, r in enumerate(table.rows, 1):
        n, b = _domain(table, i, r)
        try:
            t = seconds(r["train_time"])
        except ValueError:
            raise DataError(f"points file {str(path)!r} row {i}: train_time = "
                            f"{r['train_time']!r} must be h:mm, seconds or empty (not "
                            f"reached)") from None
        speedup = _number(table, i, "speedup", r["speedup"]) if r["speedup"].strip() else math.nan
        out.append(Reached(n, b, _number(table, i, "accuracy", r["accuracy"]), t, speedup))
    return table, tuple(out)
