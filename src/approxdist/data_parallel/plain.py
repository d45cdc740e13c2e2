"""The plain data-parallel baseline: one `dist.all_reduce` of all gradients after backward.

Weights are broadcast from the group's first rank at start (seed 001: "weights broadcast
at start"); gradients are averaged over the engine's group (the world by default).
Batch norm: each replica normalises with its own local batch statistics during training
(like DDP without SyncBatchNorm); running means/variances are averaged across replicas
before every evaluation and checkpoint, so replicas stay identical.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from approxdist.comm.update_error import Sums
from approxdist.data_parallel.buffer_stats import average_float_buffers
from approxdist.errors import ConfigError
from approxdist.launch.group import Group
from approxdist.trace.phases import SYNC
from approxdist.trace.recorder import NULL_RECORDER, Recorder


class PlainAllReduce:
    """Averages gradients over `group` with one flat all-reduce; counts bytes and time."""

    owns_step = False

    def __init__(self, model: nn.Module, group: Group, rec: Recorder = NULL_RECORDER) -> None:
        self.model = model
        self.group = group
        self.rec = rec
        self.bytes_sent = 0
        self.comm_seconds = 0.0
        self.busy_seconds = 0.0

    def broadcast_parameters(self) -> None:
        with torch.no_grad():
            for t in list(self.model.parameters()) + list(self.model.buffers()):
                self.group.broadcast(t.data)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Nothing to hold back: gradients are reduced only when asked."""
        yield

    def reduce_gradients(self) -> None:
        """Reduce now (blocking): the plain baseline has no threads."""
        self.sync_gradients()

    def finish(self) -> None:
        """Nothing in flight."""

    def sync_gradients(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return
        t0 = time.perf_counter()
        with self.rec.span(SYNC):
            flat = _flatten_dense_tensors(grads)
            self.group.all_reduce(flat)
            flat.div_(self.group.size)
            for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
                g.copy_(synced)
        self.comm_seconds += time.perf_counter() - t0
        self.busy_seconds = self.comm_seconds  # the training thread itself communicates
        self.bytes_sent += flat.numel() * flat.element_size()

    def sync_buffers(self) -> None:
        """Average floating-point buffers (batch-norm running statistics) across replicas."""
        average_float_buffers(self.model, self._buffer_mean)

    def _buffer_mean(self, flat: torch.Tensor) -> torch.Tensor:
        self.group.all_reduce(flat)
        return flat.div_(self.group.size)

    def link_bytes(self) -> dict[str, int]:
        """gloo's all-reduce is not split by link: one total for this rank."""
        return {f"{self.group.me}->allreduce": self.bytes_sent}

    def checkpoint_state(self) -> dict[str, Any]:
        return {}

    def local_state(self) -> dict[str, Any]:
        return {}

    def load_local_state(self, state: Mapping[str, Any]) -> None:
        """Stateless."""

    def set_codecs(self, codec_rules: Sequence[str], codec: str) -> None:
        raise ConfigError("the plain reducer sends fp32 through dist.all_reduce and cannot "
                          "switch codecs; use --dp-reducer approxdist")

    def update_error(self, measure: bool) -> Sums:
        """Nothing: fp32 loses nothing."""
        return {}

    def load_checkpoint_state(self, state: Mapping[str, Any]) -> None:
        """Stateless."""

    def close(self) -> None:
        """Nothing to release."""
