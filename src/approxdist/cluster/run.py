"""`approxdist cluster run`: torchrun in every host namespace, one c10d rendezvous on host 0.

Host h runs, inside its namespace,

    python -m torch.distributed.run --nnodes H --nproc-per-node K --rdzv-backend c10d
        --rdzv-endpoint <host 0>:PORT --rdzv-conf is_host=<h == 0> --local-addr <host h>
        -m approxdist <command>

with gloo bound to the namespace's `eth0` (`GLOO_SOCKET_IFNAME`) and
`APPROXDIST_RANKS_PER_MACHINE` = H x K, so that each rank takes its share of the one
machine's cores, not one host's. `is_host` and
`--local-addr` are given explicitly: every namespace shares the machine's host name,
so torchrun cannot tell from it which agent serves the store or which address the
workers reach it on. Each host's output is prefixed `[host h]`; when a host fails, the
others get `grace_s` to end on their own (a dead peer is an error there too), then are
stopped, and the exit status names the host that failed first. A host that vanishes
resets no connection, so its peers learn of it only at the run's collective timeout
(`train.timeout_s`, 120 s by default, above the default grace): a host stopped at the end
of the grace period is reported as waiting for the lost one, which it names.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, TextIO

from approxdist.cluster import state
from approxdist.cluster.commands import Command
from approxdist.cluster.layout import HOST_IFACE, ClusterLayout
from approxdist.errors import ClusterError
from approxdist.launch.affinity import RANKS_PER_MACHINE_ENV

DEFAULT_PORT = 29400
GRACE_S = 60.0


def torchrun_argv(layout: ClusterLayout, host: int, nproc: int, port: int,
                  argv: list[str], python: str = sys.executable) -> Command:
    """The command host `host` runs: torchrun in its namespace, gloo on its interface."""
    return ["ip", "netns", "exec", layout.host_ns(host), "env",
            f"GLOO_SOCKET_IFNAME={HOST_IFACE}",
            f"{RANKS_PER_MACHINE_ENV}={layout.hosts * nproc}",  # every host shares the cores
            python, "-m", "torch.distributed.run",
            "--nnodes", str(layout.hosts), "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{layout.address(0)}:{port}",
            "--rdzv-id", f"approxdist-{layout.name}",
            "--rdzv-conf", f"is_host={'true' if host == 0 else 'false'}",
            "--local-addr", layout.address(host), "-m", "approxdist", *argv]


def cluster_layout(name: str) -> ClusterLayout:
    """The layout of cluster `name`, which must be up."""
    found = state.load(name)
    if found is None:
        raise ClusterError(f"no cluster named {name!r}; make one with `approxdist cluster up "
                           f"--name {name} --hosts 2`")
    layout, status = found
    if status != "up":
        raise ClusterError(f"cluster {name!r} is {status!r}, not up (its `up` did not finish); "
                           f"`approxdist cluster down --name {name}` and up again")
    return layout


def run_on_cluster(name: str, argv: list[str], nproc_per_host: int = 1,
                   port: int = DEFAULT_PORT, grace_s: float = GRACE_S,
                   out: TextIO = sys.stdout) -> int:
    """Run the approxdist command `argv` on every host of cluster `name`; 0 if all succeed."""
    command = argv[1:] if argv and argv[0] == "approxdist" else list(argv)
    if not command:
        raise ClusterError("nothing to run: put an approxdist command after `--`, e.g. "
                           "`approxdist cluster run -- train --epochs 1`")
    if nproc_per_host < 1:
        raise ClusterError(f"--nproc-per-host {nproc_per_host} must be >= 1")
    layout = cluster_layout(name)
    procs = [subprocess.Popen(torchrun_argv(layout, h, nproc_per_host, port, command),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for h in range(layout.hosts)]
    lock = threading.Lock()
    pumps = [threading.Thread(target=_pump, args=(p.stdout, f"[host {h}] ", out, lock),
                              daemon=True) for h, p in enumerate(procs)]
    for t in pumps:
        t.start()
    try:
        codes, order = _wait(procs, grace_s)
    except BaseException:
        _stop(procs)
        raise
    for t in pumps:
        t.join(timeout=5.0)
    return _report(layout, codes, order, grace_s)


def _pump(stream: IO[str] | None, prefix: str, out: TextIO, lock: threading.Lock) -> None:
    if stream is None:
        return
    for line in stream:
        with lock:
            out.write(prefix + line)
            out.flush()


def _wait(procs: list[subprocess.Popen[str]], grace_s: float
          ) -> tuple[list[int | None], list[int]]:
    """Exit codes per host (None: stopped by us) and the order in which hosts ended."""
    order: list[int] = []
    failed_at: float | None = None
    while len(order) < len(procs):
        for h, p in enumerate(procs):
            if h not in order and p.poll() is not None:
                order.append(h)
                if p.returncode != 0 and failed_at is None:
                    failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            break
        time.sleep(0.1)
    stopped = [h for h in range(len(procs)) if h not in order]
    _stop([procs[h] for h in stopped])
    return [None if h in stopped else procs[h].returncode for h in range(len(procs))], order


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
        for p in alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=wait_s)


def _report(layout: ClusterLayout, codes: list[int | None], order: list[int],
            grace_s: float = GRACE_S) -> int:
    """One line per host that did not succeed; the exit status of the first to fail."""
    failed = [h for h in order if codes[h] != 0]
    for h, code in enumerate(codes):
        if code != 0:
            how = _exit(code) if code is not None else \
                _stopped(layout, failed[0], grace_s) if failed else "was stopped"
            first = " (first to fail)" if failed and h == failed[0] else ""
            print(f"approxdist cluster: host {_where(layout, h)} {how}{first}", file=sys.stderr)
    if not failed:
        return 0 if all(c == 0 for c in codes) else 1
    code = codes[failed[0]]
    return code if code is not None and code > 0 else 1


def _where(layout: ClusterLayout, host: int) -> str:
    return f"{host} ({layout.host_ns(host)}, {layout.address(host)})"


def _stopped(layout: ClusterLayout, lost: int, grace_s: float) -> str:
    """Why a host still running at the end of the grace period was stopped."""
    return (f"was stopped {grace_s:g} s after host {_where(layout, lost)} failed, its ranks "
            f"still waiting for host {lost}'s: host {lost} is lost (a host that vanishes "
            f"resets no connection, so they would fail only at the run's train.timeout_s; "
            f"a --grace above it lets them end with their own error)")


def _exit(code: int) -> str:
    if code < 0:
        return f"was killed by signal {signal.Signals(-code).name}"
    return f"exited with status {code}"
