"""Plain text in and out: the comma lists that flags and config keys take, and JSON files.

Below every layer (with `errors`), so a config section, the topology, the pipeline and
the command line parse `"2,1,1"` alike, every file format writes its JSON alike, and a
file that is missing, unreadable or not JSON is refused in the same one line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from approxdist.errors import ApproxDistError, ConfigError, DataError

T = TypeVar("T")


def comma_list(text: str, kind: Callable[[str], T], error: Exception) -> tuple[T, ...]:
    """`"2,1,1"` -> (2, 1, 1) with `kind=int`; raises `error` (the caller's, naming its
    flag or key and an example) where a part is not a `kind`, an empty one included."""
    try:
        return tuple(kind(part) for part in str(text).split(","))
    except ValueError:
        raise error from None


def positive_ints(text: str, flag: str, example: str = "4,8", word: str = "") -> tuple[int, ...]:
    """A flag's comma list of integers >= 1 (`"4,8"` -> (4, 8)); one `ConfigError` line
    naming the flag and an example otherwise (`word`: what else the flag takes, e.g. auto)."""
    bad = ConfigError(f"{flag} {text!r} is not {word + ' or ' if word else ''}a comma list "
                      f"of integers >= 1; e.g. {example}")
    values = comma_list(text, int, bad)
    if any(v < 1 for v in values):
        raise bad
    return values


def name_list(text: str) -> tuple[str, ...]:
    """`"ring, brd,,auto"` -> ("ring", "brd", "auto"): the items of a comma list of names
    (codecs, algorithms, keys), each stripped of spaces, empty items dropped."""
    return tuple(part.strip() for part in str(text).split(",") if part.strip())


def write_json(path: str | Path, obj: Any) -> Path:
    """Write `obj` to `path` as indented JSON ending in a newline, making its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1) + "\n")
    return path


def read_text(path: str | Path, what: str, fix: str,
              error: type[ApproxDistError] = DataError) -> str:
    """The text of the file `path`; where it is missing or unreadable, one `error` line
    naming it as `what` (e.g. "profile file"), why, and `fix`."""
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be read ({exc})"
        raise error(f"{what} {str(path)!r} {why}; {fix}") from None


def read_json(path: str | Path, what: str, fix: str,
              error: type[ApproxDistError] = DataError) -> Any:
    """The JSON value in the file `path`; `read_text`'s errors, and one `error` line where
    it is not JSON."""
    text = read_text(path, what, fix, error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{what} {str(path)!r} is not JSON ({exc.msg} at line {exc.lineno}); "
                    f"{fix}") from None
