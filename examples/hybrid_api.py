"""Hybrid pipeline x data parallelism from your own loop: a replicated first stage.

    torchrun --nproc-per-node 3 examples/hybrid_api.py

Three ranks: stage 0 (the wide, compute-heavy blocks) on two of them, stage 1 on the
third. Every rank builds the same model from the same seed and walks the same
mini-batches; `approxdist.Pipeline(..., replicas=(2, 1))` deals the micro-batches round
robin to stage 0's replicas and sums their gradients (bf16 on the wire) before your
optimiser steps, so the run trains as one process would on the same batches.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F  # noqa: N812

import approxdist


def build_model() -> nn.Sequential:
    torch.manual_seed(0)  # the same weights on every rank
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
                         nn.Linear(64, 4))


def batches(steps: int, size: int = 48) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)  # the same data on every rank
    centres = torch.randn(4, 16, generator=gen)
    out = []
    for _ in range(steps):
        y = torch.randint(0, 4, (size,), generator=gen)
        out.append((centres[y] + 0.5 * torch.randn(size, 16, generator=gen), y))
    return out


def main(steps: int = 20) -> list[float]:
    """Train; every rank of the last stage returns its losses (the others [])."""
    data = batches(steps)
    pipe = approxdist.Pipeline(build_model(), sample=data[0][0][:2], split=[4],
                               replicas=(2, 1), schedule="1f1b", microbatches=4,
                               grad_codec="bf16", loss_fn=F.cross_entropy)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1, momentum=0.9)
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
