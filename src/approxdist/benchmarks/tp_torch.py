"""The baseline of `bench tp`: `torch.distributed.tensor.parallel` on the same plan and group.

Our plan's styles map to torch's (`parallelize_module` with `ColwiseParallel` /
`RowwiseParallel` on a 1-D `DeviceMesh` over the `tp` group; gloo on CPU):

| ours | torch |
|---|---|
| `colwise` | `ColwiseParallel()` on the `nn.Linear` |
| `rowwise` | `RowwiseParallel()` on the `nn.Linear` |
| `heads` | `ColwiseParallel()` on `qkv`, `RowwiseParallel()` on `proj`, `LocalHeads` |

For attention, torch splits the fused q, k, v projection (`qkv`) by rows and the output
projection (`proj`) by columns. It shards a weight's rows in contiguous blocks, so the
fused projection's rows are first put in head order (rank r's q, k and v rows side by side,
`tensor_parallel.shard.head_rows`), and the attention module computes its local heads,
as torchtitan sets `n_heads` to the local count. Torch has no convolution styles: a plan
with `channel_*` styles has no torch baseline (`missing_styles`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.launch.group import Group
from approxdist.tensor_parallel.shard import head_rows

#: our styles that torch.distributed.tensor.parallel has a counterpart of
TORCH_STYLES = ("colwise", "rowwise", "heads")


def missing_styles(plan: Mapping[str, str]) -> list[str]:
    """The styles of `plan` that torch has no counterpart of (sorted; empty: it has all)."""
    return sorted({style for style in plan.values() if style not in TORCH_STYLES})


class LocalHeads(nn.Module):
    """Causal self-attention (`models.gpt.CausalSelfAttention`: `qkv`, `proj`, `heads`,
    `dropout`) whose fused projection's rows are in head order for `size` ranks; once
    torch shards `qkv` by rows and `proj` by columns, each rank computes its own heads."""

    def __init__(self, full: Any, size: int) -> None:
        super().__init__()
        dim = full.proj.in_features
        self.width, self.heads, self.dropout = dim // full.heads, full.heads // size, full.dropout
        order = [row for rank in range(size) for row in head_rows(dim, full.heads, rank, size)]
        self.qkv = nn.Linear(dim, 3 * dim, bias=full.qkv.bias is not None)
        with torch.no_grad():
            self.qkv.weight.copy_(full.qkv.weight[order])
            if full.qkv.bias is not None:
                self.qkv.bias.copy_(full.qkv.bias[order])
        self.proj = full.proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        qkv = self.qkv(x)  # this rank's heads' q, k, v side by side
        local = qkv.shape[-1] // 3
        q, k, v = (z.view(b, t, local // self.width, self.width).transpose(1, 2)
                   for z in qkv.split(local, dim=2))
        drop = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, local))


def torch_tp(model: nn.Module, plan: Mapping[str, str], group: Group, device: str) -> nn.Module:
    """`model` (in place) split over `group` by torch's tensor parallelism as `plan` says;
    every style of `plan` must be one of `TORCH_STYLES`."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    assert not missing_styles(plan), missing_styles(plan)
    styles: dict[str, Any] = {}
    for path, style in plan.items():
        if style == "heads":
            model.set_submodule(path, LocalHeads(model.get_submodule(path), group.size))
            styles.update({f"{path}.qkv": ColwiseParallel(), f"{path}.proj": RowwiseParallel()})
        else:
            styles[path] = ColwiseParallel() if style == "colwise" else RowwiseParallel()
    parallelize_module(model, DeviceMesh.from_group(group.pg, device), styles)
    return model
