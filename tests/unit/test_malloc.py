"""`launch.malloc.hold_freed_memory`: freed memory is reused without page faults (glibc)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from approxdist.launch.malloc import MMAP_MB, TRIM_MB, hold_freed_memory

#: a training step's pattern: twelve 4 MiB "activations" allocated, touched and freed,
#: six times; print the minor page faults of the last round
SCRIPT = """
import resource, sys, torch
from approxdist.launch.malloc import hold_freed_memory
trim_mb, mmap_mb = (int(v) for v in sys.argv[1:3])
assert hold_freed_memory(trim_mb, mmap_mb) == ""
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    xs = [torch.empty(1 << 20, dtype=torch.float32).fill_(1.0) for _ in range(12)]
    del xs
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[-1])
"""

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _last_round_faults(trim_mb: int, mmap_mb: int) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(trim_mb), str(mmap_mb)],
                         capture_output=True, text=True, check=True, timeout=120)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc malloc only")
def test_freed_memory_is_reused_without_faults() -> None:
    pages = (48 << 20) // 4096
    assert _last_round_faults(TRIM_MB, MMAP_MB) < pages // 20  # kept in the heap: reused
    # the control: thresholds of 0 map and unmap every block, so every round faults
    # (glibc's own adaptive thresholds fall anywhere between the two)
    assert _last_round_faults(0, 0) > pages // 2


def test_says_why_when_it_cannot() -> None:
    reason = hold_freed_memory()
    assert (reason == "") == GLIBC
    if not GLIBC:
        assert "not glibc" in reason
