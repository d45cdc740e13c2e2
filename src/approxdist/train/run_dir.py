"""The run directory before any worker starts: made (or, for `--check`, found makeable)
and writable, each failure one error line naming the folder and what to do."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from approxdist.errors import ConfigError


def _reason(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def check_can_make(path: Path, flag: str) -> None:
    """Refuse `path` unless it is a writable folder or could be made as one (creates
    nothing: the nearest existing folder above it must be writable)."""
    above = path
    while not above.exists() and above.parent != above:
        above = above.parent
    if not above.is_dir():
        raise ConfigError(f"{flag} {str(path)!r}: {str(above)!r} is a file, not a folder, so "
                          f"the folder cannot be made there; pick another one")
    if not os.access(above, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {str(path)!r}: cannot write into {str(above)!r}; pick a "
                          f"folder you can write, or make that one writable")


def make_run_dir(path: Path, flag: str) -> None:
    """Make `path` (and its parents) and check a file can be written into it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{flag} {str(path)!r}: cannot make that folder ({_reason(exc)}); "
                          f"pick a folder you can write") from None
    check_writable(path, flag)


def check_writable(path: Path, flag: str) -> None:
    """Refuse an existing folder `path` a new file cannot be written into."""
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".approxdist-probe-"):
            pass
    except OSError as exc:
        raise ConfigError(f"{flag} {str(path)!r}: cannot write into that folder "
                          f"({_reason(exc)}); make it writable, or pick another folder") from None
