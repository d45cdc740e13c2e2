"""Our codecs and algorithms as a torch DDP communication hook (seeds 001 and 004).

    state = register_hook(ddp_model, algorithm="native", codec="fp16", link="bw=1gbit")

DDP calls the hook once per bucket, in bucket order, during backward; the hook hands the
bucket to one communication thread (its own process group and `Link`, so the emulated
link, byte counts and codecs apply exactly as in `DataParallel`) and returns a Future
that completes with the bucket's mean. With `fp32` it equals plain DDP.

Per-parameter codecs (`codec_rules`, the rules and named policies of `codec_rules.py`,
e.g. `["policy:seed004"]`): a DDP bucket is cut into runs of consecutive parameters that
share a codec, and each run is reduced in its own codec (DDP's padding travels with the
last run); a run whose codec is `fastest` gets the fastest codec for its size in
`codec_times`. With one codec the whole bucket is one message, as before.

Error feedback (`comm.error_feedback`, the one `DataParallel` uses) keeps its residuals
per *parameter* (found through `GradBucket.parameters()`): each bucket layout gets its
own `ErrorFeedback`, and a new layout (DDP's bucket rebuild after the first iteration)
starts from the residuals saved under the same parameter names; `state_dict()` saves
them under those names.
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
from approxdist.comm.error_feedback import ErrorFeedback
from approxdist.data_parallel.codec_rules import CodecRules, param_owners
from approxdist.data_parallel.codec_times import CodecTimes, load_times
from approxdist.data_parallel.threads import GIL_SWITCH_MS, CommPool, CommThread
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, world_group


class HookState:
    """The hook's thread, codecs per parameter and error feedback per bucket layout."""

    def __init__(self, ctx: DistContext, names: Mapping[int, str], algorithm: str = "auto",
                 codec: str = "fp32", link: str | None = None, error_feedback: bool = False,
                 calibration: Calibration | str | Path | None = None,
                 gil_switch_ms: float | None = GIL_SWITCH_MS, group: Group | None = None,
                 codec_rules: list[str] | Mapping[str, str] | None = None,
                 codec_times: CodecTimes | str | Path | None = None,
                 owners: Mapping[int, nn.Module] | None = None) -> None:
        """`group`: the ranks of DDP's process group (default the world); `owners`: id(param)
        -> the module registering it, for `type:` rules (`register_hook` passes them)."""
        group = group if group is not None else world_group(ctx)
        self.error_feedback = error_feedback
        self.names = dict(names)  # id(param) -> name
        self.rules = CodecRules.parse(codec_rules, codec, load_times(codec_times, algorithm,
                                                                     group.size))
        self.rules.validate()
        owner = owners or {}
        self.codecs = {pid: self.rules.codec_for(name, owner.get(pid, nn.Module()))
                       for pid, name in self.names.items()}
        self.pool = CommPool(ctx, group, link, 1, algorithm, calibration, name="ddp",
                             gil_switch_ms=gil_switch_ms)
        self._feedback: dict[tuple[str, ...], ErrorFeedback] = {}
        self._saved: dict[str, torch.Tensor] = {}  # loaded residuals not yet in a layout

    def runs(self, numel: int, params: list[torch.Tensor]) -> list[tuple[int, int, str]]:
        """`(start, stop, codec)` of each run of consecutive parameters sharing a codec."""
        out: list[list[Any]] = []
        at = 0
        for p in params:
            spec = self.codecs.get(id(p), self.rules.default)
            if out and out[-1][2] == spec:
                out[-1][1] = at + p.numel()
            else:
                out.append([at, at + p.numel(), spec])
            at += p.numel()
        if not out:
            out.append([0, numel, self.rules.default])
        out[-1][1] = numel  # DDP's alignment padding travels with the last run
        return [(a, b, self.rules.resolve(spec, 4 * (b - a))) for a, b, spec in out]

    def reduce(self, flat: torch.Tensor, params: list[torch.Tensor], thread: CommThread) -> None:
        for start, stop, codec in self.runs(flat.numel(), params):
            reducer = thread.reducer(codec)
            part = flat[start:stop]
            if self.error_feedback and not reducer.codec.lossless:
                self._compensate(flat, params, reducer.codec, start, stop)
            reducer(part, op="mean")

    def _compensate(self, flat: torch.Tensor, params: list[torch.Tensor], codec: Codec,
                    start: int = 0, stop: int | None = None) -> None:
        """Compensate `flat[start:stop]` (all of it by default) against `codec`."""
        if sum(p.numel() for p in params) != flat.numel():
            return  # a bucket padded for alignment: compensate none of it
        part = flat[start:stop]
        self._feedback_for(params, flat.device).compensate(part, start, codec)

    def _feedback_for(self, params: list[torch.Tensor], device: torch.device) -> ErrorFeedback:
        names = tuple(self.names[id(p)] for p in params)
        ef = self._feedback.get(names)
        if ef is None:  # a new layout: carry over what earlier layouts kept for these names
            layout, at = [], 0
            for name, p in zip(names, params):
                layout.append((name, at, p.numel()))
                at += p.numel()
            ef = ErrorFeedback(layout, at, device)
            ef.load_state_dict(self.state_dict())
            self._feedback[names] = ef
        return ef

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Residuals per parameter name (the latest layout holding a name wins)."""
        out = dict(self._saved)
        for ef in self._feedback.values():
            out.update(ef.state_dict())
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self._saved = {k: v.clone().reshape(-1) for k, v in state.items()}
        for ef in self._feedback.values():
            ef.load_state_dict(self._saved)

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
    by_name = param_owners(ddp.module)
    owners = {id(p): by_name[n] for n, p in ddp.module.named_parameters()}
    state = HookState(ctx, names, owners=owners, **options)
    ddp.register_comm_hook(state, comm_hook)
    return state
