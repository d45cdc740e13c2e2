"""Self-attention with its heads split over the tensor-parallel ranks (Megatron-LM, Sec. 3).

Rank r computes heads [r h / n, (r + 1) h / n): the fused q, k, v projection is
column-parallel on those heads' rows (the input enters through `copy_to`), attention
runs on the local heads alone, and the output projection is row-parallel on their
columns (`reduce_from` sums the partial outputs). One all-reduce forward, one backward.
With `sequence` (sequence parallelism) the input holds this rank's positions: the
projection gathers every position first and the output is reduce-scattered back to them.
Attention dropout draws every head's mask and keeps this rank's (`causal_attention`): the
masks one process would draw, so the split model equals it with dropout too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from approxdist.models.gpt import causal_attention
from approxdist.tensor_parallel.comm import TPComm
from approxdist.tensor_parallel.layers import ColumnLinear, RowLinear
from approxdist.tensor_parallel.shard import head_rows, piece


class HeadParallelAttention(nn.Module):
    """`full` (a `models.gpt.CausalSelfAttention`: `qkv`, `proj`, `heads`, `dropout`) on
    this rank's heads."""

    def __init__(self, full: Any, comm: TPComm, site: str, sequence: bool = False) -> None:
        super().__init__()
        dim = full.proj.in_features
        self.heads = full.heads // comm.size
        self.width = dim // full.heads
        self.dropout = full.dropout
        rows = head_rows(dim, full.heads, comm.rank, comm.size)
        cols = piece(full.heads, comm.rank, comm.size, "attention heads")
        self.total, self.part = full.heads, slice(cols.start, cols.stop)
        self.qkv = ColumnLinear(full.qkv, rows, comm, f"{site}.qkv", sequence)
        self.proj = RowLinear(full.proj, slice(cols.start * self.width, cols.stop * self.width),
                              comm, f"{site}.proj", sequence)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)  # every position's, with sequence parallelism too
        b, t, _ = qkv.shape
        local = self.heads * self.width
        q, k, v = (z.view(b, t, self.heads, self.width).transpose(1, 2)
                   for z in qkv.split(local, dim=2))
        y = causal_attention(q, k, v, self.dropout if self.training else 0.0,
                             self.total, self.part)
        return self.proj(y.transpose(1, 2).reshape(b, t, local))
