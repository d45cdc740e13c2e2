"""What the Trainer needs from a data-parallel engine, and the factory that picks one from config.

Both engines — `plain.PlainAllReduce` (one flat `dist.all_reduce` after backward) and
`engine.DataParallel` (buckets, overlap, threads, codecs, early forward; seeds 001, 004) —
offer the same small interface, so the trainer's data-parallel engine
(`train/engines/replicated.py`) never asks which one it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch import nn

from approxdist.config.schema import Config
from approxdist.launch.context import DistContext
from approxdist.launch.group import Group
from approxdist.trace.recorder import NULL_RECORDER, Recorder


class GradientSync(Protocol):
    """The Trainer's view of a data-parallel engine."""

    bytes_sent: int  # bytes this rank handed to torch.distributed (settable on resume)

    @property
    def comm_seconds(self) -> float:
        """Seconds the training thread waited for communication."""

    @property
    def busy_seconds(self) -> float:
        """Seconds spent communicating (by communication threads, or the training thread)."""

    @property
    def owns_step(self) -> bool:
        """True when the engine applies the optimizer step itself (early forward)."""

    def broadcast_parameters(self) -> None: ...

    def sync_gradients(self) -> None: ...

    def sync_buffers(self) -> None: ...

    def link_bytes(self) -> dict[str, int]:
        """Bytes this rank sent so far per directed link `"i->j"` (global ranks)."""

    def checkpoint_state(self) -> dict[str, Any]:
        """Every member's engine state (a collective over the group), for one checkpoint."""

    def load_checkpoint_state(self, state: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def build_sync(cfg: Config, model: nn.Module, optimizer: torch.optim.Optimizer | None,
               ctx: DistContext, group: Group, rec: Recorder = NULL_RECORDER,
               **options: Any) -> GradientSync:
    """The engine `cfg.dp.engine` names, around `model`, averaging over `group`; weights
    are broadcast later (`broadcast_parameters`).

    `rec` records the engine's phases (sync, waits, transfers; docs/tracing.md);
    `options` go to `DataParallel` as they are (e.g. `op="sum"`).
    """
    dp = cfg.dp
    if dp.engine == "plain":
        from approxdist.data_parallel.plain import PlainAllReduce

        return PlainAllReduce(model, group, rec)
    from approxdist.data_parallel.engine import DataParallel

    return DataParallel(model, ctx=ctx, group=group, algorithm=dp.algorithm, codec=dp.codec,
                        codec_rules=dp.codec_rules, codec_times=dp.codec_times or None,
                        error_feedback=dp.error_feedback,
                        link=cfg.comm.link or None, bucket_mb=dp.bucket_mb,
                        first_bucket_mb=dp.first_bucket_mb, threads=dp.threads,
                        chunk_kb=dp.chunk_kb, overlap=dp.overlap, early_forward=dp.early_forward,
                        optimizer=optimizer, find_unused_parameters=dp.find_unused,
                        broadcast=False, calibration=dp.calibration or None,
                        gil_switch_ms=dp.gil_switch_ms or None, recorder=rec, **options)
