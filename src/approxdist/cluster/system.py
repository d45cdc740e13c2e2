"""Running `ip` / `tc`: one line naming the failed command; root and netem detection."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from approxdist.cluster.commands import Command
from approxdist.errors import ClusterError

CAP_NET_ADMIN = 12


def run(cmd: Command, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `cmd`; a failure raises `ClusterError` with the command and ip/tc's message."""
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        why = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}")
        raise ClusterError(f"`{' '.join(cmd)}` failed: {why.splitlines()[0]}")
    return done


def require_net_admin(status: Path = Path("/proc/self/status")) -> None:
    """`ClusterError` unless `ip` and `tc` exist and this process may administer networks."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise ClusterError(f"approxdist cluster needs iproute2 ({', '.join(missing)} not "
                           f"found); install it (Debian: apt install iproute2)")
    if os.geteuid() == 0 or _has_cap(status, CAP_NET_ADMIN):
        return
    raise ClusterError("approxdist cluster needs root or CAP_NET_ADMIN to make network "
                       "namespaces and shape links with tc; run it with sudo")


def _has_cap(status: Path, bit: int) -> bool:
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False


def namespaces() -> set[str]:
    """The network namespaces `ip netns list` knows."""
    out = run(["ip", "netns", "list"]).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def has_netem(ns: str) -> bool:
    """Whether this kernel has the netem qdisc (probed on the namespace's loopback)."""
    added = run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us"],
                check=False)
    if added.returncode != 0:
        return False
    run(["tc", "-n", ns, "qdisc", "del", "dev", "lo", "root"], check=False)
    return True
