"""Run a function on N gloo ranks in fresh local processes and collect each rank's result.

This is the one helper every distributed test and every multi-rank benchmark uses: it
picks a free loopback port, starts the ranks from the fork server that has torch already
imported (`launch/forkserver.py`; fast), enforces a timeout, and reports which rank failed
and why.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

from approxdist.errors import LaunchError
from approxdist.launch.forkserver import EnvDelta, fork_context
from approxdist.launch.ports import free_port


def _worker(fn: Callable[..., Any], env: EnvDelta, rank: int, world: int, port: int,
            args: tuple[Any, ...], timeout_s: float, results: Any) -> None:
    env.apply()
    import torch
    import torch.distributed as dist

    from approxdist.launch.context import DistContext
    from approxdist.launch.malloc import hold_freed_memory

    torch.set_num_threads(1)
    hold_freed_memory()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        if world > 1:
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://127.0.0.1:{port}",
                rank=rank,
                world_size=world,
                timeout=datetime.timedelta(seconds=timeout_s),
            )
        backend = "gloo" if world > 1 else "none"
        ctx = DistContext(rank, world, rank, torch.device("cpu"), backend, timeout_s)
        out = fn(ctx, *args)
        # plain pickle: tensors travel by value, not as shared-memory handles that die
        # with this process
        results.put((rank, True, pickle.dumps(out)))
    except BaseException:  # noqa: BLE001 - reported to the parent with the rank
        results.put((rank, False, traceback.format_exc()))
    finally:
        if world > 1 and dist.is_initialized():
            with contextlib.suppress(Exception):  # best effort at teardown
                dist.destroy_process_group()


def run_on_ranks(fn: Callable[..., Any], world_size: int, *args: Any,
                 timeout_s: float = 120.0, comm_timeout_s: float = 30.0) -> list[Any]:
    """Call `fn(ctx, *args)` on ranks 0..world_size-1; return the results in rank order.

    `fn` must be a module-level function (it is pickled). Raises `LaunchError` naming
    every rank that raised or died, with its traceback or exit code, and never leaves a
    process behind: after the first failure the others get a short grace period and are
    then killed. `comm_timeout_s` is the process group's collective timeout.
    """
    if world_size < 1:
        raise LaunchError(f"world size {world_size} must be >= 1")
    ctx, env = fork_context()
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(fn, env, r, world_size, port, args, comm_timeout_s, results),
                    daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    outs: dict[int, Any] = {}
    failures: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    grace_end: float | None = None
    try:
        while len(outs) + len(failures) < world_size:
            now = time.monotonic()
            if now > deadline or (grace_end is not None and now > grace_end):
                break
            try:
                rank, ok, value = results.get(timeout=0.2)
            except queue.Empty:
                for r, p in enumerate(procs):
                    if r not in outs and r not in failures and not p.is_alive():
                        _drain(results, outs, failures)
                        if r not in outs and r not in failures:
                            failures[r] = f"died with exit code {p.exitcode}"
                if failures and grace_end is None:
                    grace_end = time.monotonic() + min(comm_timeout_s, 15.0)
                continue
            (outs if ok else failures)[rank] = value
            if not ok and grace_end is None:
                grace_end = time.monotonic() + min(comm_timeout_s, 15.0)
    finally:
        for p in procs:
            p.join(timeout=0.0 if failures or len(outs) < world_size else 5.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
        results.close()
    if failures or len(outs) < world_size:
        missing = [r for r in range(world_size) if r not in outs and r not in failures]
        lines = [f"rank {r} failed:\n{msg}" for r, msg in sorted(failures.items())]
        lines += [f"rank {r} did not finish within {timeout_s:.0f} s" for r in missing]
        raise LaunchError("\n".join(lines))
    return [pickle.loads(outs[r]) for r in range(world_size)]


def _drain(results: Any, outs: dict[int, Any], failures: dict[int, str]) -> None:
    while True:
        try:
            rank, ok, value = results.get_nowait()
        except queue.Empty:
            return
        (outs if ok else failures)[rank] = value
