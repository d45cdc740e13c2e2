"""Waiting for an event another process makes (a file, a process ending, a `Marks`
handshake), with a timeout.

The timeout only turns a hang into a failure, as `run_on_ranks(timeout_s=...)` does: it
is generous against any machine's speed and never the property a test checks. This is
the one place in tests/ that reads the clock (tests/unit/test_no_timing_in_tests.py).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

#: how often a condition is polled
POLL_S = 0.1


def wait_until(done: Callable[[], bool], what: str, timeout_s: float) -> None:
    """Return once `done()` is true; fail naming `what` if it is still false after
    `timeout_s` seconds."""
    end = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(POLL_S)


def wait_for_file(path: Path, timeout_s: float,
                  proc: subprocess.Popen[str] | None = None) -> None:
    """Return once `path` is a file; fail at once if `proc` ends before it appears."""
    def appeared() -> bool:
        if proc is not None and not path.is_file():
            assert proc.poll() is None, f"the run ended before {path} appeared"
        return path.is_file()

    wait_until(appeared, f"{path} never appeared", timeout_s)


def alive(pid: int) -> bool:
    """Whether process `pid` still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Marks:
    """Events that ranks announce and others wait for, one empty file each in a folder every
    rank sees: a test orders what its processes do by these handshakes, never by sleeps."""

    def __init__(self, folder: str | Path, timeout_s: float = 120.0) -> None:
        self.folder, self.timeout_s = Path(folder), timeout_s
        self.folder.mkdir(parents=True, exist_ok=True)

    def mark(self, name: str) -> None:
        (self.folder / name).touch()

    def wait(self, name: str) -> None:
        wait_for_file(self.folder / name, self.timeout_s)
