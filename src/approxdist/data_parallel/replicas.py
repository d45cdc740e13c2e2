"""The one interface to a module's gradients over its replicas, and the factory that picks one.

Data parallelism, a hybrid run's replicated pipeline stages and an asynchronous pipeline's
replicated stage all ask the same of whoever reduces their gradients over the replicas:
a `ReplicaReducer`. Two implement it: `module.DataParallel` (buckets, overlap, threads,
codecs, early forward; seeds 001, 004) and `plain.PlainAllReduce` (one flat
`dist.all_reduce` after backward, the baseline); `build_reducer` picks one from the `[dp]`
section. Callers never ask which one they hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch import nn

from approxdist.comm.update_error import Sums
from approxdist.config.dp import DPConfig
from approxdist.config.wire import EXACT, Wire
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group
from approxdist.trace.recorder import NULL_RECORDER, Recorder


class ReplicaReducer(Protocol):
    """A module's gradients (and buffers) reduced over the replicas of its group."""

    bytes_sent: int  # bytes this rank handed to torch.distributed (settable on resume)

    @property
    def comm_seconds(self) -> float:
        """Seconds the training thread waited for communication."""

    @property
    def busy_seconds(self) -> float:
        """Seconds spent communicating (by communication threads, or the training thread)."""

    @property
    def owns_step(self) -> bool:
        """True when the reducer applies the optimizer step itself (early forward)."""

    def broadcast_parameters(self) -> None:
        """Copy the group's first member's parameters and buffers to every member."""

    def no_sync(self) -> AbstractContextManager[None]:
        """Backward passes inside only accumulate local gradients (earlier micro-batches)."""

    def reduce_gradients(self) -> None:
        """Start reducing the current `.grad`s now, outside backward."""

    def finish(self) -> None:
        """Wait until every reduction started has landed in `.grad`."""

    def sync_gradients(self) -> None:
        """After a backward: the reduced gradients are in `.grad` when this returns."""

    def sync_buffers(self) -> None:
        """Average floating-point buffers (batch-norm statistics) over the replicas."""

    def link_bytes(self) -> dict[str, int]:
        """Bytes this rank sent so far per directed link `"i->j"` (global ranks)."""

    def checkpoint_state(self) -> dict[str, Any]:
        """Every member's state (a collective over the group), for one checkpoint."""

    def load_checkpoint_state(self, state: Mapping[str, Any]) -> None: ...

    def local_state(self) -> dict[str, Any]:
        """This member's state without collectives (error-feedback residuals), as
        references: what an in-process snapshot copies (AdaPrec)."""

    def load_local_state(self, state: Mapping[str, Any]) -> None: ...

    def set_codecs(self, codec_rules: Sequence[str], codec: str) -> None:
        """Send the next gradients in other codecs, keeping the residuals (AdaPrec)."""

    def update_error(self, measure: bool) -> Sums:
        """What the codecs did to this member's gradients while watched, per
        parameter (||sent - exact||^2, ||exact||^2, size); `measure`: go on watching (from
        now, if not), False stops (AdaPrec)."""

    def close(self) -> None: ...


def build_reducer(dp: DPConfig, model: nn.Module, group: Group, *, wire: Wire = EXACT,
                  ctx: DistContext | None = None, link: str = "",
                  optimizer: torch.optim.Optimizer | None = None,
                  rec: Recorder = NULL_RECORDER, **options: Any) -> ReplicaReducer:
    """The reducer `dp.reducer` names, around `model`, over `group`, its gradients on `wire`
    (codec, per-parameter rules, error feedback); weights are broadcast later
    (`broadcast_parameters`).

    `link` is the emulated link of every transfer; `rec` records the reducer's phases
    (sync, waits, transfers; docs/tracing.md); `options` go to `DataParallel` as they are
    (e.g. `op="sum"`).
    """
    if dp.reducer == "plain":
        from approxdist.data_parallel.plain import PlainAllReduce

        return PlainAllReduce(model, group, rec)
    from approxdist.data_parallel.module import DataParallel

    return DataParallel(model, ctx=ctx, group=group, algorithm=dp.algorithm, codec=wire.codec,
                        codec_rules=wire.rules, codec_times=wire.times or None,
                        error_feedback=wire.error_feedback,
                        link=link or None, bucket_mb=dp.bucket_mb,
                        first_bucket_mb=dp.first_bucket_mb, threads=dp.threads,
                        chunk_kb=dp.chunk_kb, overlap=dp.overlap, early_forward=dp.early_forward,
                        optimizer=optimizer, find_unused_parameters=dp.find_unused,
                        broadcast=False, calibration=dp.calibration or None,
                        gil_switch_ms=dp.gil_switch_ms or None, recorder=rec, **options)
