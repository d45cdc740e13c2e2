"""Column-, row- and channel-parallel layers (Megatron-LM's `ColumnParallelLinear` /
`RowParallelLinear`; seed 003's split within a layer and by channel), cut from a full layer.

Each is built from the full layer every rank holds (the same weights from the same seed)
and keeps its rank's part:
- `ColumnLinear`: the output features (rows of W) listed; the input replicated, entering
  through `copy_to` (its gradient summed over the ranks backward); the output stays split;
- `RowLinear`: the input features (columns of W); the partial products summed through
  `reduce_from`, then the bias (replicated) added once;
- `ChannelConv`: a convolution's output channels (the input replicated, `copy_to`), or
  its input channels (`reduce_from` of the partial sums) — the convolutional forms;
- `channel_norm`: a batch norm over the channels this rank computes (statistics and
  affine parameters per channel, so splitting them changes nothing);
- with `sequence=True` (sequence parallelism, `sequence.py`) a column-parallel layer
  gathers its input's positions instead of `copy_to`, a row-parallel one reduce-scatters
  its partial outputs along the sequence instead of `reduce_from`, and its bias (added to
  this rank's positions) has its gradient summed over the ranks; `SequenceNorm` is a
  layer norm on this rank's positions whose weight and bias gradients are summed so.
`full_index` says which entries of the full parameter a shard holds (gradients compare
with one process, checkpoints reshard).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.tensor_parallel.comm import TPComm
from approxdist.tensor_parallel.regions import copy_to, reduce_from
from approxdist.tensor_parallel.sequence import gather_from_sequence, reduce_scatter_to_sequence

Index = Sequence[int] | slice


def _take(t: torch.Tensor, dim: int, index: Index) -> nn.Parameter:
    part = t.detach()[index] if dim == 0 else t.detach()[:, index]
    return nn.Parameter(part.clone().contiguous(), requires_grad=t.requires_grad)


class ColumnLinear(nn.Module):
    """`full`'s output features `rows`; the output stays split over the ranks (with
    `sequence`, the input's positions are gathered first)."""

    def __init__(self, full: nn.Linear, rows: Index, comm: TPComm, site: str,
                 sequence: bool = False) -> None:
        super().__init__()
        self.comm, self.site, self.sequence = comm, site, sequence
        self.weight = _take(full.weight, 0, rows)
        self.bias = _take(full.bias, 0, rows) if full.bias is not None else None
        self.full_index = {"weight": (0, rows), "bias": (0, rows)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = gather_from_sequence(x, self.comm, self.site, partial_grad=True) if self.sequence \
            else copy_to(x, self.comm, self.site)
        return F.linear(x, self.weight, self.bias)


class RowLinear(nn.Module):
    """`full`'s input features `cols`; the partial outputs summed over the ranks (with
    `sequence`, reduce-scattered along the sequence)."""

    def __init__(self, full: nn.Linear, cols: Index, comm: TPComm, site: str,
                 sequence: bool = False) -> None:
        super().__init__()
        self.comm, self.site, self.sequence = comm, site, sequence
        self.weight = _take(full.weight, 1, cols)
        self.bias = nn.Parameter(full.bias.detach().clone()) if full.bias is not None else None
        self.full_index = {"weight": (1, cols)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if not self.sequence:
            y = reduce_from(y, self.comm, self.site)
            return y + self.bias if self.bias is not None else y
        y = reduce_scatter_to_sequence(y, self.comm, self.site)
        return y + copy_to(self.bias, self.comm, f"{self.site}.bias") \
            if self.bias is not None else y


class SequenceNorm(nn.Module):
    """`full` layer norm on this rank's positions (sequence parallelism): the same weight
    and bias on every rank, their gradients summed over the ranks (`copy_to`)."""

    def __init__(self, full: nn.LayerNorm, comm: TPComm, site: str) -> None:
        super().__init__()
        self.comm, self.site = comm, site
        self.shape, self.eps = tuple(full.normalized_shape), full.eps
        self.weight = nn.Parameter(full.weight.detach().clone()) \
            if full.weight is not None else None
        self.bias = nn.Parameter(full.bias.detach().clone()) if full.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = copy_to(self.weight, self.comm, f"{self.site}.weight") \
            if self.weight is not None else None
        b = copy_to(self.bias, self.comm, f"{self.site}.bias") if self.bias is not None else None
        return F.layer_norm(x, self.shape, w, b, self.eps)


class ChannelConv(nn.Module):
    """`full` convolution's output channels (`split="out"`) or input channels
    (`split="in"`, partial sums reduced) `channels`."""

    def __init__(self, full: nn.Conv1d | nn.Conv2d, channels: Index, split: str, comm: TPComm,
                 site: str) -> None:
        super().__init__()
        self.comm, self.site, self.split = comm, site, split
        dim = 0 if split == "out" else 1
        self.weight = _take(full.weight, dim, channels)
        self.bias = None
        if full.bias is not None:
            self.bias = _take(full.bias, 0, channels) if split == "out" else \
                nn.Parameter(full.bias.detach().clone())
        self.full_index = {"weight": (dim, channels), **({"bias": (0, channels)}
                                                         if split == "out" else {})}
        self._conv: Any = F.conv1d if isinstance(full, nn.Conv1d) else F.conv2d
        self._args: tuple[Any, ...] = (full.stride, full.padding, full.dilation, full.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.split == "out":
            return self._conv(copy_to(x, self.comm, self.site), self.weight, self.bias,
                              *self._args)
        y = reduce_from(self._conv(x, self.weight, None, *self._args), self.comm, self.site)
        if self.bias is not None:
            y = y + self.bias.view(1, -1, *([1] * (y.dim() - 2)))
        return y


def channel_norm(full: nn.BatchNorm1d | nn.BatchNorm2d,
                 channels: Index) -> nn.BatchNorm1d | nn.BatchNorm2d:
    """A batch norm of `full`'s type over its `channels` (statistics and affine parameters
    per channel: exact); its `full_index` says which."""
    n = len(range(full.num_features)[channels]) if isinstance(channels, slice) \
        else len(channels)
    norm = type(full)(n, eps=full.eps, momentum=full.momentum, affine=full.affine,
                      track_running_stats=full.track_running_stats)
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            src, dst = getattr(full, name), getattr(norm, name)
            if src is not None and dst is not None:
                dst.copy_(src[channels])
        if full.num_batches_tracked is not None and norm.num_batches_tracked is not None:
            norm.num_batches_tracked.copy_(full.num_batches_tracked)
    norm.full_index = {k: (0, channels)  # type: ignore[assignment]
                       for k in ("weight", "bias", "running_mean", "running_var")}
    return norm


def shard_index(model: nn.Module) -> dict[str, tuple[int, Index]]:
    """Every split parameter and buffer of `model`: its full name -> (the dimension split,
    this rank's index along it); a name not listed is whole on every rank."""
    out: dict[str, tuple[int, Index]] = {}
    for path, module in model.named_modules():
        for name, where in getattr(module, "full_index", {}).items():
            out[f"{path}.{name}" if path else name] = where
    return out
