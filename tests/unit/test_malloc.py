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


def _last_round_faults(*settings: tuple[int, int]) -> list[int]:
    """The last round's faults under each (trim_mb, mmap_mb), the processes run at once."""
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(trim), str(mmap)],
                              stdout=subprocess.PIPE, text=True) for trim, mmap in settings]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return [int(out.strip().splitlines()[-1]) for out in outs]


@pytest.mark.skipif(not GLIBC, reason="glibc malloc only")
def test_freed_memory_is_reused_without_faults() -> None:
    pages = (48 << 20) // 4096
    # the control: thresholds of 0 map and unmap every block, so every round faults
    # (glibc's own adaptive thresholds fall anywhere between the two)
    held, control = _last_round_faults((TRIM_MB, MMAP_MB), (0, 0))
    assert held < pages // 20  # kept in the heap: reused
    assert control > pages // 2


def test_says_why_when_it_cannot() -> None:
    reason = hold_freed_memory()
    assert (reason == "") == GLIBC
    if not GLIBC:
        assert "not glibc" in reason
