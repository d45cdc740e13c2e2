"""Start rank processes from one fork server that has torch imported: one import for all ranks.

A spawned rank imports torch, torch.distributed and torch._dynamo (the first optimizer step
pulls it in) on its own: about 4 s of CPU a rank, more than a short run trains. The fork
server imports them once per launching process and forks every rank from there, as the
test suite's spawn helper does. A forked rank starts with the environment the server had
when it started, not the caller's of now; `EnvDelta.apply` gives it the caller's, so a
rank sees the environment a spawned one would.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.forkserver as mp_forkserver
import os
from dataclasses import dataclass, field
from typing import Any

#: what every rank needs before its first step; the entry's own module is added per launch
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "approxdist.launch.context")


@dataclass
class _Server:
    """The process-wide fork server's context and the environment it started with."""

    ctx: Any
    env: dict[str, str] = field(default_factory=dict)
    started: bool = False


_SERVER = _Server(mp.get_context("forkserver"))


@dataclass(frozen=True)
class EnvDelta:
    """The environment the fork server started with and the launching process's of now."""

    base: dict[str, str]
    now: dict[str, str]

    def apply(self) -> None:
        """In a forked rank: take the launcher's environment of now; what the rank's own
        launcher set in this process since the fork (RANK, MASTER_PORT, ...) stays."""
        own = {k: v for k, v in os.environ.items() if self.base.get(k) != v}
        for key in [k for k in os.environ if k not in self.now]:
            del os.environ[key]
        os.environ.update(self.now)
        os.environ.update(own)


def fork_context(*modules: str) -> tuple[Any, EnvDelta]:
    """The fork server's context (started now, `modules` preloaded on first use) and the
    environment a rank started from it must apply first."""
    server = _SERVER  # one per process: the point is that it is started once
    if not server.started:
        server.ctx.set_forkserver_preload([*PRELOAD, *modules])
        server.env = dict(os.environ)
        mp_forkserver.ensure_running()
        server.started = True
    return server.ctx, EnvDelta(server.env, dict(os.environ))
