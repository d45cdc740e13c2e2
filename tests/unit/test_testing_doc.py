"""docs/testing.md stays true: every test its table of modes and oracles names exists.

The table cites `file.py::test_name` (a file under tests/dist, or a path from the
repository root) and `::test_name` for another test of the same file; each must be a
test function of that file, and every row of the table must cite at least one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "testing.md"
CITE = re.compile(r"`((?:[\w/]+\.py)?)::(\w+)(?:\[[^\]]*\])?`")


def _rows() -> list[str]:
    text = DOC.read_text()
    table = text[text.index("## Every mode and its oracle"):]
    return [line for line in table.splitlines() if line.startswith("| ")
            and not line.startswith("| mode or feature")]


def _cited(row: str) -> list[tuple[Path, str]]:
    out, current = [], None
    for name, test in CITE.findall(row):
        if name:
            current = ROOT / name if "/" in name else ROOT / "tests" / "dist" / name
        assert current is not None, f"'::{test}' names no file before it: {row[:80]}"
        out.append((current, test))
    return out


def test_every_row_cites_tests_that_exist() -> None:
    rows = _rows()
    assert len(rows) > 20
    for row in rows:
        cited = _cited(row)
        assert cited, f"a row of docs/testing.md names no test: {row[:80]}"
        for path, test in cited:
            assert path.is_file(), f"docs/testing.md cites {path.relative_to(ROOT)}: no such file"
            assert re.search(rf"^def {test}\(", path.read_text(), re.MULTILINE), \
                f"docs/testing.md cites {path.relative_to(ROOT)}::{test}: no such test"
