"""What every benchmark prints and writes: a fixed-width table, the closing lines, `--json` rows.

A table is a list of `Column`s (title, width, alignment, how to show a row's value; a
missing value shows as "-"; `ratio` and `scaled` make the cells of ratios and scaled
figures). Every run ends with the host line (steal time, `host.py`) and, where the
benchmark has one, a `reproduce:` line with the command; `--json FILE` gets the rows
with `host_steal_fraction` added to each, so a figure can always be read next to what
the hypervisor took during its run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from approxdist.bench.host import HostWatch
from approxdist.errors import ConfigError
from approxdist.text import write_json

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Column:
    """One column: `key` of the row (or `show`, a function of the row), `fmt` for values."""

    title: str
    width: int
    key: str = ""
    fmt: str = ""
    left: bool = False
    show: Callable[[Row], str] | None = None

    def cell(self, row: Row) -> str:
        if self.show is not None:
            return self.show(row)
        value = row.get(self.key)
        return "-" if value is None else format(value, self.fmt)

    def pad(self, text: str) -> str:
        return f"{text:<{self.width}}" if self.left else f"{text:>{self.width}}"


def scaled(key: str, scale: float, fmt: str) -> Callable[[Row], str]:
    """A cell showing `row[key] * scale` with `fmt`; "-" when missing (or 0, as bytes)."""
    return lambda r: format(r[key] * scale, fmt) if r.get(key) else "-"


def ratio(key: str, fmt: str = ".2f") -> Callable[[Row], str]:
    """A cell showing `row[key]` as a ratio, `1.23x`; "-" when missing."""
    return lambda r: f"{r[key]:{fmt}}x" if r.get(key) is not None else "-"


def render(columns: Sequence[Column], rows: Sequence[Row], *, sep: str = " ",
           rule: bool = False) -> str:
    """The header, an optional rule under it, and one line per row."""
    head = sep.join(c.pad(c.title) for c in columns)
    lines = [head] + (["-" * len(head)] if rule else [])
    lines += [sep.join(c.pad(c.cell(r)) for c in columns) for r in rows]
    return "\n".join(lines)


def with_steal(rows: Sequence[Row], host: HostWatch) -> list[dict[str, Any]]:
    """The rows as JSON objects with `host_steal_fraction` added."""
    return [{**r, "host_steal_fraction": host.steal} for r in rows]


def add_json_flag(p: argparse.ArgumentParser) -> None:
    """`--json FILE`: where `finish` writes the rows (every benchmark command takes it)."""
    p.add_argument("--json", type=Path, help="write the rows to this JSON file")


def add_round_flags(p: argparse.ArgumentParser, rounds: int, steps: int) -> None:
    """`--rounds` and `--steps` (each round times every variant in turn, `steps` steps each)
    and `--json`: what every benchmark of training steps takes; `check_counts` checks them."""
    p.add_argument("--rounds", type=int, default=rounds,
                   help="timed rounds, interleaving the variants (default %(default)s)")
    p.add_argument("--steps", type=int, default=steps,
                   help="timed steps per variant and round (default %(default)s)")
    add_json_flag(p)


def finish(host: HostWatch, rows: Sequence[Row], json_path: Path | None = None,
           reproduce: str = "") -> None:
    """Print the host line (and the command to reproduce); write `--json` rows if asked."""
    print(host.line())
    if reproduce:
        print(f"reproduce: {reproduce}")
    if json_path is not None:
        write_json(json_path, with_steal(rows, host))
        print(f"rows written to {json_path}")


def check_counts(**counts: int) -> None:
    """Every count (`rounds=5`, `steps=4`, ...) must be >= 1: `ConfigError` naming the flag."""
    for name, value in counts.items():
        if value < 1:
            raise ConfigError(f"--{name} {value} must be >= 1; e.g. --{name} 5")
