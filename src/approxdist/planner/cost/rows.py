"""Read the JSON rows a benchmark writes (`approxdist bench ... --json FILE`): a list of objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from approxdist.errors import DataError
from approxdist.text import read_json


def read_rows(path: str | Path, writer: str) -> list[Any]:
    """The JSON list of rows in `path`, written by `approxdist <writer> FILE`."""
    data = read_json(path, "file", f"write it with approxdist {writer} {path}")
    if not isinstance(data, list):
        raise DataError(f"file {str(path)!r} holds a JSON {type(data).__name__}, not the list "
                        f"of rows approxdist {writer} writes")
    return data
