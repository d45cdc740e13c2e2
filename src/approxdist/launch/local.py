"""Start N local workers through torch's elastic launcher (the machinery behind torchrun).

The workers are forked from the process's fork server (`launch/forkserver.py`), which has
torch and the entry's module imported already.

Rendezvous is on 127.0.0.1 with a free port, so nothing listens on a public address by
default. When any worker fails the agent stops the others and we raise a `LaunchError`
that names the failed rank(s).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from approxdist.errors import LaunchError
from approxdist.launch.context import prefer_loopback
from approxdist.launch.forkserver import EnvDelta, fork_context
from approxdist.launch.ports import free_port

HOST = "127.0.0.1"


def signal_suffix(code: int) -> str:
    """` (SIGKILL)` for an exit code that is a negated signal number, else empty."""
    import signal

    try:
        return f" ({signal.Signals(-code).name})" if code < 0 else ""
    except ValueError:
        return ""


def _forked(env: EnvDelta, entry: Callable[..., Any], *args: Any) -> Any:
    env.apply()
    return entry(*args)


def launch_local(entry: Callable[..., Any], world_size: int, *args: Any,
                 describe: Callable[[int], str] | None = None) -> dict[int, Any]:
    """Run `entry(*args)` on `world_size` local ranks; return each rank's return value.

    `describe(rank)` names a failed rank in the error (e.g. with its place in the
    topology: "rank 2 (stage 1, replica 0)"); default "rank N".
    """
    if world_size < 1:
        raise LaunchError(f"world size {world_size} must be >= 1")
    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.ERROR)
    prefer_loopback(HOST)
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=world_size,
        run_id=f"approxdist-{uuid.uuid4().hex[:8]}",
        rdzv_backend="static", rdzv_endpoint=f"{HOST}:{free_port(HOST)}",
        rdzv_configs={"rank": 0}, max_restarts=0, monitor_interval=0.5,
        start_method="forkserver", local_addr=HOST,
    )
    _, env = fork_context(entry.__module__)
    try:
        return elastic_launch(config, _forked)(env, entry, *args)
    except ChildFailedError as exc:
        parts = []
        for rank, failure in sorted(exc.failures.items()):
            code = failure.exitcode
            msg = failure.message if isinstance(failure.message, str) else ""
            detail = msg.strip().splitlines()[-1] if msg.strip() else ""
            name = describe(rank) if describe is not None else f"rank {rank}"
            parts.append(f"{name} failed with exit code {code}{signal_suffix(code)}"
                         + (f": {detail}" if detail else ""))
        raise LaunchError("; ".join(parts) + "; the other workers were stopped") from None
