"""What the host took from a benchmark: CPU time stolen by the hypervisor during the run.

On a virtual machine the host may run other guests on the same physical cores; the time
it takes is *steal* in `/proc/stat` (Linux). Benchmarks interleave their baseline, so
steal hits both sides, but it widens the spread of single runs (on the 2-core
development VM, runs with 10-15 % steal moved ratios by up to 20 %). `HostWatch` reads
the counters before and after a run so every benchmark can print the share next to its
figures and store it in its JSON rows (`host_steal_fraction`); None where the counters
do not exist.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuTimes:
    """All-CPU counters of `/proc/stat` (clock ticks): the total and the stolen part."""

    total: int
    steal: int


def parse_cpu_times(text: str) -> CpuTimes | None:
    """The aggregate `cpu ` line of a `/proc/stat` text; None if absent or malformed."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            try:
                fields = [int(v) for v in line.split()[1:]]
            except ValueError:
                return None
            if len(fields) < 8:  # user nice system idle iowait irq softirq steal
                return None
            return CpuTimes(total=sum(fields[:8]), steal=fields[7])
    return None


def read_cpu_times(path: Path = PROC_STAT) -> CpuTimes | None:
    try:
        return parse_cpu_times(path.read_text())
    except OSError:
        return None


def steal_fraction(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """Share of all CPU time between the two readings that the host stole."""
    if before is None or after is None or after.total <= before.total:
        return None
    return (after.steal - before.steal) / (after.total - before.total)


class HostWatch:
    """`with HostWatch() as host: ...` then `host.steal` and `host.line()`."""

    def __init__(self, path: Path = PROC_STAT) -> None:
        self.path = path
        self._before: CpuTimes | None = None
        self.steal: float | None = None
        self.load: float | None = None

    def __enter__(self) -> HostWatch:
        self._before = read_cpu_times(self.path)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.steal = steal_fraction(self._before, read_cpu_times(self.path))
        try:
            self.load = os.getloadavg()[0]
        except OSError:
            self.load = None

    def line(self) -> str:
        """One line for the benchmark's output."""
        steal = "unknown" if self.steal is None else f"{100 * self.steal:.0f} %"
        load = "" if self.load is None else f", load average {self.load:.1f} at the end"
        return f"host: CPU time stolen by the hypervisor during the run {steal}{load}"
