"""CSV files of experiments: written with a fixed column list, read back with a check.

Numbers are stored as written (full precision); reading converts every cell that
parses as a float. Aggregates over seeds (mean, sample standard deviation, min, max)
live here too, so every preset reports spread the same way.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from approxdist.errors import DataError

Row = dict[str, Any]


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write `rows` (each with exactly `columns` as keys) to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="raise")
        writer.writeheader()
        for row in rows:
            missing = [c for c in columns if c not in row]
            if missing:
                raise DataError(f"{path.name}: row lacks column(s) {', '.join(missing)}")
            writer.writerow({c: row[c] for c in columns})
    return path


def _cell(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def read_csv(path: Path, columns: Sequence[str]) -> list[Row]:
    """Rows of `path` with numeric cells as floats; raises if a documented column is missing."""
    if not path.is_file():
        raise DataError(f"{str(path)!r} not found; run the experiment first "
                        f"(approxdist experiment NAME --out DIR)")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(f"{path.name} lacks column(s) {', '.join(missing)}; "
                            f"expected: {', '.join(columns)}")
        return [{k: _cell(v) for k, v in row.items()} for row in reader]


@dataclass(frozen=True)
class CsvFile:
    """One CSV file of an experiment: its name in the output directory and its documented
    columns, which `collect` writes, `render` reads and the runner checks."""

    name: str
    columns: tuple[str, ...]

    def write(self, out: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
        return write_csv(out / self.name, self.columns, rows)

    def read(self, out: Path) -> list[Row]:
        return read_csv(out / self.name, self.columns)


def spread(values: Sequence[float]) -> dict[str, float]:
    """mean, std (sample; 0 for one value), min, max and n of finite-or-not `values`."""
    vals = [float(v) for v in values]
    if not vals:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    std = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return {"mean": statistics.fmean(vals), "std": std, "min": min(vals), "max": max(vals),
            "n": len(vals)}


def group(rows: Iterable[Row], *keys: str) -> dict[tuple[Any, ...], list[Row]]:
    """Rows grouped by the values of `keys`, in first-seen order."""
    out: dict[tuple[Any, ...], list[Row]] = {}
    for row in rows:
        out.setdefault(tuple(row[k] for k in keys), []).append(row)
    return out
