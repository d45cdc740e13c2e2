"""Evaluation on this rank's share of the test set, summed over ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.data.base import TensorDataset
from approxdist.data.loader import eval_shard
from approxdist.launch.context import DistContext


@torch.no_grad()
def evaluate(model: nn.Module, data: TensorDataset, ctx: DistContext,
             batch_size: int) -> tuple[float, float]:
    """(test accuracy in [0, 1], mean test loss) over the whole test set."""
    model.eval()
    x_all, y_all = eval_shard(data, ctx.rank, ctx.world_size)
    sums = torch.zeros(3, dtype=torch.float64)
    for lo in range(0, x_all.shape[0], batch_size):
        x = x_all[lo:lo + batch_size].to(ctx.device)
        y = y_all[lo:lo + batch_size].to(ctx.device)
        out = model(x)
        sums[0] += F.cross_entropy(out, y, reduction="sum").item()
        sums[1] += (out.argmax(1) == y).sum().item()
        sums[2] += y.numel()
    if ctx.distributed:
        dist.all_reduce(sums)
    model.train()
    return float(sums[1] / sums[2]), float(sums[0] / sums[2])


def all_mean(values: list[float], ctx: DistContext) -> list[float]:
    """Mean of each value over ranks (identity on one rank)."""
    t = torch.tensor(values, dtype=torch.float64)
    if ctx.distributed:
        dist.all_reduce(t)
        t /= ctx.world_size
    return t.tolist()
