"""Our codecs and algorithms as a torch DDP communication hook (seeds 001 and 004).

    state = register_hook(ddp_model, algorithm="native", codec="fp16", link="bw=1gbit")

DDP calls the hook once per bucket, in bucket order, during backward; the hook hands the
bucket to one communication thread (its own process group and `Link`, so the emulated
link, byte counts and codecs apply exactly as in `DataParallel`) and returns a Future
that completes with the bucket's mean. With `fp32` it equals plain DDP.

Error feedback keeps one residual per *parameter* (found through
`GradBucket.parameters()`), so it survives DDP's bucket rebuild after the first
iteration and is saved by `state_dict()` under parameter names.
"""

# no `from __future__ import annotations`: DDP checks the hook's annotations at run time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from approxdist.comm.codecs import Codec
from approxdist.comm.collectives import Calibration
from approxdist.data_parallel.threads import GIL_SWITCH_MS, CommPool, CommThread
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, world_group


class HookState:
    """The hook's thread, codec and per-parameter residuals."""

    def __init__(self, ctx: DistContext, names: Mapping[int, str], algorithm: str = "hybrid",
                 codec: str = "fp32", link: str | None = None, error_feedback: bool = False,
                 calibration: Calibration | str | Path | None = None,
                 gil_switch_ms: float | None = GIL_SWITCH_MS, group: Group | None = None) -> None:
        """`group`: the ranks of DDP's process group (default the world)."""
        self.codec, self.error_feedback = codec, error_feedback
        self.names = dict(names)  # id(param) -> name
        self.pool = CommPool(ctx, group if group is not None else world_group(ctx), link, 1,
                             algorithm, calibration, name="ddp", gil_switch_ms=gil_switch_ms)
        self.residuals: dict[str, torch.Tensor] = {}

    def reduce(self, flat: torch.Tensor, params: list[torch.Tensor], thread: CommThread) -> None:
        reducer = thread.reducer(self.codec)
        if self.error_feedback and not reducer.codec.lossless:
            self._compensate(flat, params, reducer.codec)
        reducer(flat, op="mean")

    def _compensate(self, flat: torch.Tensor, params: list[torch.Tensor], codec: Codec) -> None:
        r = torch.cat([self._residual(p) for p in params]) if params else flat.new_zeros(0)
        if r.numel() != flat.numel():  # a bucket padded for alignment: compensate none of it
            return
        flat.add_(r)
        sent = codec.roundtrip(flat)  # what the wire carries of our contribution
        new = flat - sent
        at = 0
        for p in params:
            self.residuals[self.names[id(p)]] = new[at:at + p.numel()].clone()
            at += p.numel()

    def _residual(self, p: torch.Tensor) -> torch.Tensor:
        r = self.residuals.get(self.names[id(p)])
        return r if r is not None else torch.zeros(p.numel(), device=p.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.residuals.items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.residuals = {k: v.clone().reshape(-1) for k, v in state.items()}

    def bytes_sent(self) -> int:
        return self.pool.bytes_sent()

    def close(self) -> None:
        self.pool.close()


def comm_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The hook DDP calls: reduce `bucket.buffer()` on the state's thread, return a Future."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    buf = bucket.buffer()
    params = list(bucket.parameters())

    def job(thread: CommThread) -> None:
        try:
            work = buf if buf.dtype == torch.float32 else buf.float()
            state.reduce(work, params, thread)
            if work is not buf:
                buf.copy_(work)
            fut.set_result(buf)
        except BaseException as exc:  # noqa: BLE001 - delivered to DDP through the Future
            fut.set_exception(exc)  # type: ignore[arg-type]  # torch's stub is wrong

    state.pool.submit(job)
    return fut


def register_hook(ddp: nn.parallel.DistributedDataParallel, ctx: DistContext,
                  **options: Any) -> HookState:
    """Build a `HookState` for `ddp`'s module and register `comm_hook` on `ddp`."""
    names = {id(p): n for n, p in ddp.module.named_parameters()}
    state = HookState(ctx, names, **options)
    ddp.register_comm_hook(state, comm_hook)
    return state
