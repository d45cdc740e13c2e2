"""Plain text in and out: the comma lists that flags and config keys take, and JSON files.

Below every layer (with `errors`), so a config section, the topology, the pipeline and
the command line parse `"2,1,1"` alike, and every file format writes its JSON alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def comma_list(text: str, kind: Callable[[str], T], error: Exception) -> tuple[T, ...]:
    """`"2,1,1"` -> (2, 1, 1) with `kind=int`; raises `error` (the caller's, naming its
    flag or key and an example) where a part is not a `kind`, an empty one included."""
    try:
        return tuple(kind(part) for part in str(text).split(","))
    except ValueError:
        raise error from None


def write_json(path: str | Path, obj: Any) -> Path:
    """Write `obj` to `path` as indented JSON ending in a newline, making its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1) + "\n")
    return path
