"""What makes a recomputed forward identical to the stored one (GPipe's re-materialisation,
Huang et al. 2019 §2.3): the same random numbers (dropout) and batch-norm running statistics
left as they were."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

#: CPU generator state, and the device generator's when the stage runs on a GPU
RngState = tuple[torch.Tensor, torch.Tensor | None]


def rng_state(device: torch.device) -> RngState:
    gpu = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), gpu


@contextlib.contextmanager
def replayed_rng(state: RngState, device: torch.device) -> Iterator[None]:
    """Run the block with the generators set to `state`; restore the current ones afterwards."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], device)
        yield


@contextlib.contextmanager
def frozen_batchnorm_stats(module: nn.Module) -> Iterator[None]:
    """Restore batch-norm running statistics on exit (a recomputed forward must not count twice)."""
    norms = [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    saved = [[b.clone() for b in (m.running_mean, m.running_var, m.num_batches_tracked)
              if b is not None] for m in norms]
    try:
        yield
    finally:
        for m, bufs in zip(norms, saved):
            live = [b for b in (m.running_mean, m.running_var, m.num_batches_tracked)
                    if b is not None]
            for b, old in zip(live, bufs):
                b.copy_(old)
