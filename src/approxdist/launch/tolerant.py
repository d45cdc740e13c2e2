"""Start N local ranks that survive the loss of some of them (`--tolerate-worker-loss`).

torch's elastic agent (`launch/local.py`, torchrun) stops every rank as soon as one
exits. This launcher starts the ranks itself (one forked process each, the torchrun
environment variables set) and hosts the run's c10d store, which the ranks join as
clients. When a rank that `expendable` allows to die ends without finishing (killed,
crashed), the launcher posts it on the store's loss board (`launch/lost_ranks.py`), prints a
warning line naming it and lets the others go on; when any other rank fails it stops the
rest and raises a `LaunchError` naming the failed rank(s), as `launch_local` does.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import torch.distributed as dist

from approxdist.errors import LaunchError
from approxdist.launch.context import prefer_loopback
from approxdist.launch.forkserver import EnvDelta, fork_context
from approxdist.launch.local import HOST, signal_suffix
from approxdist.launch.lost_ranks import LossBoard
from approxdist.launch.ports import free_port

_POLL_S = 0.1


@dataclass
class Outcome:
    """What each rank returned, and the ranks lost on the way (rank -> why)."""

    results: dict[int, Any] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)


def _rank_main(entry: Callable[..., Any], launcher_env: EnvDelta, env: dict[str, str],
               args: tuple[Any, ...], result: Connection) -> None:
    launcher_env.apply()
    os.environ.update(env)
    try:
        out = entry(*args)
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher with the rank
        traceback.print_exc()
        result.send((False, f"{type(exc).__name__}: {exc}".strip().splitlines()[-1]))
        sys.exit(1)
    result.send((True, pickle.dumps(out)))
    # done, and the process group already left: a survivor may still hold a receive
    # posted to a dead rank (gloo cannot cancel one), and finalising the interpreter with
    # it pending aborts the process ("terminate called ..."), so leave at once
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch_tolerant(entry: Callable[..., Any], world_size: int, *args: Any,
                    expendable: Callable[[int], bool], describe: Callable[[int], str],
                    timeout_s: float = 120.0) -> Outcome:
    """Run `entry(*args, board)` on `world_size` local ranks, `board` being the `host:port`
    of the store holding the loss board; each surviving rank's return value.

    A rank with `expendable(rank)` may die: it is posted as lost and the run goes on.
    """
    if world_size < 1:
        raise LaunchError(f"world size {world_size} must be >= 1")
    prefer_loopback(HOST)
    port = free_port(HOST)
    store = dist.TCPStore(HOST, port, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    board = LossBoard(store)
    ctx, launcher_env = fork_context(entry.__module__)
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]  # (read end, write end)
    base = {"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": HOST, "MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": "True"}  # every rank a client of our store
    procs = [ctx.Process(target=_rank_main, daemon=False,
                         args=(entry, launcher_env, {**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                               (*args, f"{HOST}:{port}"), pipes[r][1]))
             for r in range(world_size)]
    for p in procs:
        p.start()
    for _, write in pipes:
        write.close()  # the child holds it: a dead child's pipe reads as closed
    out = Outcome()
    finished = False
    try:
        _watch(procs, [read for read, _ in pipes], board, out, expendable, describe)
        finished = True
    finally:
        _stop(procs, grace_s=timeout_s if finished else 0.0)
        for read, _ in pipes:
            read.close()
    return out


def _watch(procs: list[Any], results: list[Connection], board: LossBoard, out: Outcome,
           expendable: Callable[[int], bool], describe: Callable[[int], str]) -> None:
    """Until every rank has finished or been lost; raise on the failure of a needed rank."""
    errors: dict[int, str] = {}
    closed: set[int] = set()  # ranks whose pipe closed with nothing in it: they died
    while len(out.results) + len(out.lost) < len(procs):
        waiting = [c for r, c in enumerate(results) if r not in out.results and r not in errors
                   and r not in out.lost and r not in closed]
        for ready in wait(waiting, timeout=_POLL_S):
            rank = next(r for r, c in enumerate(results) if c is ready)
            closed.add(rank)
            with contextlib.suppress(EOFError, OSError):
                ok, value = results[rank].recv()
                if ok:
                    out.results[rank] = pickle.loads(value)
                else:
                    errors[rank] = value
        if closed - set(out.results) - set(errors) - set(out.lost):
            time.sleep(_POLL_S / 10)  # a dead rank's pipe closes just before it is reaped
        failed = {r: _why(p.exitcode, errors.get(r)) for r, p in enumerate(procs)
                  if r not in out.results and r not in out.lost
                  and (r in errors or not p.is_alive())}
        fatal = {r: why for r, why in failed.items() if not expendable(r)}
        if fatal:
            raise LaunchError("; ".join(f"{describe(r)} failed with {why}"
                                        for r, why in sorted(fatal.items()))
                              + "; the other workers were stopped")
        for r, why in sorted(failed.items()):
            out.lost[r] = why
            board.post(r, why)
            print(f"approxdist: warning: lost {describe(r)} ({why}); the others go on without "
                  f"it (--tolerate-worker-loss)", file=sys.stderr, flush=True)


def _why(code: int | None, error: str | None) -> str:
    if error:
        return f"exit code {code if code is not None else 1}: {error}"
    code = code if code is not None else 1
    return f"exit code {code}{signal_suffix(code)}"


def _stop(procs: list[Any], grace_s: float) -> None:
    """Let the ranks exit within `grace_s`, then stop any still running (never leave one)."""
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
