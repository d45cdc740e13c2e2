"""The per-rank distributed context, passed explicitly (never a global)."""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from approxdist.errors import ConfigError, LaunchError

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class DistContext:
    """Who this process is in the job; `world_size == 1` needs no process group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str = "none"
    timeout_s: float = 120.0
    #: `host:port` of the store where the tolerant launcher posts lost ranks
    #: (`launch/lost_ranks.py`); empty when a dead rank ends the run
    board: str = ""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend != "none"


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """`auto` picks this rank's GPU when one is visible, else the CPU."""
    if device not in DEVICES:
        raise ConfigError(f"device {device!r} is not one of {', '.join(DEVICES)}")
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if device == "cuda":
            raise ConfigError("device 'cuda' was asked for but no GPU is visible; use --device cpu")
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def backend_for(device: torch.device) -> str:
    """gloo on CPU, NCCL when this rank has a GPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def prefer_loopback(master_addr: str) -> None:
    """Keep gloo's data connections on loopback when the rendezvous is local."""
    if master_addr in ("127.0.0.1", "localhost", "::1"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def init_from_env(device: str = "auto", timeout_s: float = 120.0) -> DistContext:
    """Join the job described by torchrun-style env vars (RANK, WORLD_SIZE, MASTER_ADDR...).

    Without those variables this is a single-process run and no group is created.
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return DistContext(device=resolve_device(device), timeout_s=timeout_s)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    backend = backend_for(dev)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    prefer_loopback(os.environ.get("MASTER_ADDR", ""))
    try:
        dist.init_process_group(
            backend,
            init_method="env://",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    except Exception as exc:  # noqa: BLE001 - re-raised with the rank named
        raise LaunchError(f"rank {rank}: could not join the process group ({exc})") from exc
    return DistContext(rank, world, local_rank, dev, backend, timeout_s)


def current_context(device: torch.device) -> DistContext:
    """The context of a process group someone else started (a user's own `torchrun`
    script); a single-process context when there is none."""
    if not dist.is_available() or not dist.is_initialized():
        return DistContext(device=device)
    return DistContext(dist.get_rank(), dist.get_world_size(), 0, device, str(dist.get_backend()))


def shutdown(ctx: DistContext, finished: bool = False) -> None:
    """Leave the process group if this context joined one.

    `finished`: this rank ended without an error, so every rank first waits at a barrier
    (bounded by the group's timeout) until all are done with their traffic: without it, on
    two hosts one rank could tear its group down while a peer's gloo threads still carried
    that group's last messages, and the peer died at exit with `terminate called without
    an active exception`. Skipped after an error (a peer may be gone) and when lost ranks
    are tolerated (`ctx.board`: a lost rank never arrives)."""
    if not (ctx.distributed and dist.is_initialized()):
        return
    if finished and not ctx.board:
        with contextlib.suppress(Exception):  # a peer lost at the very end: tear down anyway
            dist.barrier()
    dist.destroy_process_group()
