"""Read the JSON rows a benchmark writes (`approxdist bench ... --json FILE`): a list of objects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from approxdist.errors import DataError


def read_rows(path: str | Path, writer: str) -> list[Any]:
    """The JSON list of rows in `path`, written by `approxdist <writer> FILE`."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DataError(f"file {str(path)!r} does not exist; write it with approxdist "
                        f"{writer} {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"file {str(path)!r} cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"file {str(path)!r} is not JSON ({exc.msg} at line {exc.lineno}); "
                        f"write it with approxdist {writer} {path}") from None
    if not isinstance(data, list):
        raise DataError(f"file {str(path)!r} holds a JSON {type(data).__name__}, not the list "
                        f"of rows approxdist {writer} writes")
    return data
