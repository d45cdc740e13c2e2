"""Run a function on N NCCL ranks, one GPU each, and collect each rank's result (GPU tests).

The CUDA counterpart of `launch.spawn.run_on_ranks` (gloo on CPU): rank r runs on
`cuda:r` in a freshly spawned process (CUDA cannot be forked once initialised), with a
`DistContext` of backend "nccl". Results must be picklable CPU values.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import pickle
import queue
import traceback
from collections.abc import Callable
from typing import Any

from approxdist.launch.ports import free_port


def _worker(fn: Callable[..., Any], rank: int, world: int, port: int, args: tuple[Any, ...],
            results: Any) -> None:
    import torch
    import torch.distributed as dist

    from approxdist.launch.context import DistContext

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    try:
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=60),
                                device_id=device)
        out = fn(DistContext(rank, world, rank, device, "nccl", 60.0), *args)
        results.put((rank, True, pickle.dumps(out)))
    except BaseException:  # noqa: BLE001 - reported to the parent with the rank
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def run_on_gpus(fn: Callable[..., Any], world_size: int, *args: Any,
                timeout_s: float = 180.0) -> list[Any]:
    """`fn(ctx, *args)` on ranks 0..world_size-1 (cuda:0..); the results in rank order.

    Raises `AssertionError` naming every rank that failed (with its traceback) or did not
    answer within `timeout_s`; no process is left behind."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(fn, r, world_size, port, args, results),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    outs: dict[int, Any] = {}
    failures: dict[int, str] = {}
    try:
        for _ in range(world_size):
            try:
                rank, ok, value = results.get(timeout=timeout_s)
            except queue.Empty:
                break
            (outs if ok else failures)[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
    missing = [r for r in range(world_size) if r not in outs and r not in failures]
    assert not failures and not missing, "\n".join(
        [f"rank {r} failed:\n{msg}" for r, msg in sorted(failures.items())]
        + [f"rank {r} did not answer within {timeout_s:.0f} s" for r in missing])
    return [pickle.loads(outs[r]) for r in range(world_size)]
