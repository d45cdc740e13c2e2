"""Local rank processes started and watched by us: the one pool under every local launcher.

Each rank is one process forked from the fork server (`launch/forkserver.py`) with
torchrun's environment set (RANK, WORLD_SIZE, MASTER_ADDR, ...); the run's c10d store is
hosted here and the ranks join it as clients, as under torchrun's agent. Each rank sends
its return value, or the last line of its error, through its own pipe, so the watcher sees
every death in the order it happens: a rank killed by a signal is named as such even when
a peer's error about it arrives in the same instant (torch's agent reports only the first
failure it polls). A failure is reported after `SETTLE_S`, so the ranks that fail with it
are named together; `expendable` ranks may die without ending the run (`launch/tolerant.py`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import torch.distributed as dist

from approxdist.errors import LaunchError
from approxdist.launch.context import prefer_loopback
from approxdist.launch.forkserver import EnvDelta, fork_context
from approxdist.launch.ports import free_port

HOST = "127.0.0.1"
_POLL_S = 0.1
#: how long a failure waits for the failures it causes (or was caused by) to be seen
SETTLE_S = 0.5


@dataclass
class Outcome:
    """What each rank returned, and the ranks lost on the way (rank -> why)."""

    results: dict[int, Any] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)


def signal_suffix(code: int) -> str:
    """` (SIGKILL)` for an exit code that is a negated signal number, else empty."""
    try:
        return f" ({signal.Signals(-code).name})" if code < 0 else ""
    except ValueError:
        return ""


def _never(rank: int) -> bool:
    return False


def _rank_main(entry: Callable[..., Any], launcher_env: EnvDelta, env: dict[str, str],
               args: tuple[Any, ...], result: Connection, leave_at_once: bool) -> None:
    launcher_env.apply()
    os.environ.update(env)
    try:
        out = entry(*args)
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher with the rank
        traceback.print_exc()
        result.send((False, f"{type(exc).__name__}: {exc}".strip().splitlines()[-1]))
        sys.exit(1)  # the process's finalisers run (its semaphores are released)
    result.send((True, pickle.dumps(out)))
    if leave_at_once:
        # done, and the process group already left: a survivor may still hold a receive
        # posted to a dead rank (gloo cannot cancel one), and finalising the interpreter
        # with it pending aborts the process ("terminate called ..."), so leave at once
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class RankPool:
    """`world_size` local ranks of one run and the store they meet at; use as a context
    manager: leaving it stops any rank still running (never leaves one behind).
    `survivors`: ranks may go on past a dead peer (`launch_tolerant`)."""

    def __init__(self, world_size: int, timeout_s: float, survivors: bool = False) -> None:
        if world_size < 1:
            raise LaunchError(f"world size {world_size} must be >= 1")
        prefer_loopback(HOST)
        self.world_size = world_size
        self.timeout_s = timeout_s
        port = free_port(HOST)
        self.address = f"{HOST}:{port}"
        self.store = dist.TCPStore(HOST, port, is_master=True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=timeout_s))
        self._env = {"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
                     "MASTER_ADDR": HOST, "MASTER_PORT": str(port),
                     "TORCHELASTIC_USE_AGENT_STORE": "True"}  # every rank a client of ours
        self._procs: list[Any] = []
        self._results: list[Connection] = []
        self._finished = False
        self._survivors = survivors  # ranks may outlive a dead peer: they leave at once

    def start(self, entry: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Fork every rank to run `entry(*args)`."""
        ctx, launcher_env = fork_context(entry.__module__)
        pipes = [ctx.Pipe(duplex=False) for _ in range(self.world_size)]  # (read, write)
        self._procs = [
            ctx.Process(target=_rank_main, daemon=False,
                        args=(entry, launcher_env,
                              {**self._env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              args, pipes[r][1], self._survivors))
            for r in range(self.world_size)]
        self._results = [read for read, _ in pipes]
        for p in self._procs:
            p.start()
        for _, write in pipes:
            write.close()  # the child holds it: a dead child's pipe reads as closed

    def watch(self, describe: Callable[[int], str],
              expendable: Callable[[int], bool] = _never,
              on_lost: Callable[[int, str], None] | None = None) -> Outcome:
        """Until every rank has finished or been lost; a `LaunchError` naming the failed
        ranks when one that is not `expendable` fails (the others are then stopped)."""
        out = Outcome()
        with _sigterm_stops():
            _watch(self._procs, self._results, out, describe, expendable, on_lost)
        self._finished = True
        return out

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            _stop(self._procs, grace_s=self.timeout_s if self._finished else 0.0)
        finally:
            for read in self._results:
                read.close()


def _watch(procs: list[Any], results: list[Connection], out: Outcome,
           describe: Callable[[int], str], expendable: Callable[[int], bool],
           on_lost: Callable[[int, str], None] | None) -> None:
    errors: dict[int, str] = {}
    closed: set[int] = set()  # ranks whose pipe closed: they finished or died
    settle_until: float | None = None
    while len(out.results) + len(out.lost) < len(procs):
        waiting = [c for r, c in enumerate(results) if r not in closed]
        for ready in wait(waiting, timeout=_POLL_S) if waiting else ():
            rank = next(r for r, c in enumerate(results) if c is ready)
            closed.add(rank)
            with contextlib.suppress(EOFError, OSError):
                ok, value = results[rank].recv()
                if ok:
                    out.results[rank] = pickle.loads(value)
                else:
                    errors[rank] = value
        if not waiting:
            time.sleep(_POLL_S / 10)
        failed = {r: _why(p.exitcode, errors.get(r)) for r, p in enumerate(procs)
                  if r not in out.results and r not in out.lost
                  and (r in errors or (r in closed and not p.is_alive()))}
        fatal = {r: why for r, why in failed.items() if not expendable(r)}
        if fatal:
            settle_until = settle_until or time.monotonic() + SETTLE_S
            if time.monotonic() >= settle_until or len(fatal) + len(out.results) == len(procs):
                raise LaunchError("; ".join(f"{describe(r)} failed with {why}"
                                            for r, why in sorted(fatal.items()))
                                  + "; the other workers were stopped")
            continue
        for r, why in sorted(failed.items()):
            out.lost[r] = why
            if on_lost is not None:
                on_lost(r, why)


def _why(code: int | None, error: str | None) -> str:
    if error:
        return f"exit code {code if code is not None and code != 0 else 1}: {error}"
    code = code if code is not None else 1
    return f"exit code {code}{signal_suffix(code)}"


def _stop(procs: list[Any], grace_s: float) -> None:
    """Let the ranks exit within `grace_s`, then stop any still running."""
    end = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=5.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=5.0)


@contextlib.contextmanager
def _sigterm_stops() -> Iterator[None]:
    """SIGTERM to the launcher ends the watch with an error, so its ranks are stopped
    (as torch's agent does); only where a handler can be set (the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stopped(signum: int, frame: object) -> None:
        raise LaunchError(f"the launcher was stopped ({signal.Signals(signum).name}); its "
                          f"ranks were stopped too")

    before = signal.signal(signal.SIGTERM, stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
