"""Pipeline parallelism from your own loop: your model, data, loss and optimiser.

    torchrun --nproc-per-node 2 examples/pipeline_api.py

Every rank builds the same model from the same seed and walks the same mini-batches;
`approxdist.Pipeline` keeps this rank's stage, and `step` runs one mini-batch through the
pipeline (1F1B, 4 micro-batches, bf16 activations on the wire). The model here is a small
regression network with a block of its own (not one of approxdist's models), trained with
a mean-squared error.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F  # noqa: N812

import approxdist


class Residual(nn.Module):
    """A block of the user's own: x + MLP(x)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


def build_model(width: int = 32) -> nn.Sequential:
    torch.manual_seed(0)  # the same weights on every rank
    return nn.Sequential(nn.Linear(8, width), Residual(width), Residual(width),
                         nn.Linear(width, 1))


def batches(steps: int, size: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)  # the same data on every rank
    w = torch.randn(8, 1, generator=gen)
    out = []
    for _ in range(steps):
        x = torch.randn(size, 8, generator=gen)
        out.append((x, torch.sin(x @ w)))
    return out


def main(steps: int = 30) -> list[float]:
    """Train and return the last stage's losses ([] on the other stages)."""
    data = batches(steps)
    pipe = approxdist.Pipeline(build_model(), sample=data[0][0], schedule="1f1b",
                               microbatches=4, fwd_codec="bf16", loss_fn=F.mse_loss)
    opt = torch.optim.Adam(pipe.parameters(), lr=1e-2)
    losses = []
    for x, y in data:
        loss = pipe.step(x, y)
        opt.step()
        opt.zero_grad()
        if loss is not None:
            losses.append(loss)
    pipe.close()
    if pipe.is_last:
        print(f"stage {pipe.stage}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    return losses


if __name__ == "__main__":
    dist.init_process_group("gloo")
    try:
        main()
    finally:
        dist.destroy_process_group()
