"""The plain data-parallel baseline: one `dist.all_reduce` of all gradients after backward.

Weights are broadcast from rank 0 at start (seed 001: "weights broadcast at start").
Batch norm: each replica normalises with its own local batch statistics during training
(like DDP without SyncBatchNorm); running means/variances are averaged across replicas
before every evaluation and checkpoint, so replicas stay identical.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from approxdist.launch.context import DistContext
from approxdist.trace.phases import SYNC
from approxdist.trace.recorder import NULL_RECORDER, Recorder


class PlainAllReduce:
    """Averages gradients over all ranks with one flat all-reduce; counts bytes and time."""

    owns_step = False

    def __init__(self, model: nn.Module, ctx: DistContext, rec: Recorder = NULL_RECORDER) -> None:
        self.model = model
        self.ctx = ctx
        self.rec = rec
        self.bytes_sent = 0
        self.comm_seconds = 0.0

    def broadcast_parameters(self) -> None:
        with torch.no_grad():
            for t in list(self.model.parameters()) + list(self.model.buffers()):
                dist.broadcast(t.data, src=0)

    def sync_gradients(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return
        t0 = time.perf_counter()
        with self.rec.span(SYNC):
            flat = _flatten_dense_tensors(grads)
            dist.all_reduce(flat)
            flat.div_(self.ctx.world_size)
            for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
                g.copy_(synced)
        self.comm_seconds += time.perf_counter() - t0
        self.bytes_sent += flat.numel() * flat.element_size()

    def sync_buffers(self) -> None:
        """Average floating-point buffers (batch-norm running statistics) across replicas."""
        bufs = [b for b in self.model.buffers() if b.is_floating_point()]
        if not bufs:
            return
        flat = _flatten_dense_tensors(bufs)
        dist.all_reduce(flat)
        flat.div_(self.ctx.world_size)
        for b, synced in zip(bufs, _unflatten_dense_tensors(flat, bufs)):
            b.copy_(synced)

    def world_link_bytes(self) -> dict[str, int]:
        """gloo's all-reduce is not split by link: one total for this rank."""
        return {"allreduce:native": self.bytes_sent}

    def checkpoint_state(self) -> dict[str, Any]:
        return {}

    def load_checkpoint_state(self, state: Mapping[str, Any]) -> None:
        """Stateless."""
