"""A parameter server from your own loop: one server holds the parameters and the
optimiser, two workers compute gradients on their halves of every mini-batch.

    torchrun --nproc-per-node 3 examples/ps_api.py

Every rank builds the same model of its own (a residual MLP, not one of approxdist's)
from the same seed. Rank 0 serves; ranks 1 and 2 walk the same mini-batches, each
taking its half, and call `ps.step` once per mini-batch: forward, backward, push the
gradients (bf16 on the wire, with error feedback), pull the parameters the server's
Adam produced. In sync mode this trains as one process would on the whole batches.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F  # noqa: N812

import approxdist


class ResidualMLP(nn.Module):
    """Input layer, one residual block, classifier."""

    def __init__(self, features: int = 16, width: int = 64, classes: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.block = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
        self.out = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.inp(x))
        return self.out(h + self.block(h))


def batches(steps: int, size: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)  # the same data on every rank
    centres = torch.randn(4, 16, generator=gen)
    out = []
    for _ in range(steps):
        y = torch.randint(0, 4, (size,), generator=gen)
        out.append((centres[y] + 1.5 * torch.randn(size, 16, generator=gen), y))
    return out


def main(steps: int = 30, mode: str = "sync") -> list[float]:
    """Train; every worker returns its losses (the server [])."""
    torch.manual_seed(0)  # the same weights on every rank
    data = batches(steps)
    ps = approxdist.ParameterServer(
        ResidualMLP(), servers=1, mode=mode, steps=steps,
        optimizer=lambda params: torch.optim.Adam(params, lr=1e-2),
        loss_fn=F.cross_entropy, push_codec="bf16", error_feedback=True)
    losses: list[float] = []
    if ps.is_server:
        ps.serve()
    else:
        share = ps.index, ps.roles.workers  # this worker's slice of every mini-batch
        for x, y in data:
            loss = ps.step(x[share[0]::share[1]], y[share[0]::share[1]])
            if loss is not None:
                losses.append(loss)
        print(f"worker {ps.index}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    ps.close()
    return losses


if __name__ == "__main__":
    dist.init_process_group("gloo")
    try:
        main()
    finally:
        dist.destroy_process_group()
