"""What every rank must agree on before data parallelism can start, with errors that say why.

Seed 001 starts from identical replicas ("weights broadcast at start; same random seed on
all nodes"). Broadcasting weights needs the same *structure* everywhere: the same
parameter names, shapes, dtypes and trainable flags in the same order. `check_same_model`
compares them across ranks once, at construction, and raises the same error on every
rank naming the first difference — instead of a hang or a silent wrong sum later.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext

Signature = list[tuple[str, tuple[int, ...], str, bool]]


def context_of(module: nn.Module) -> DistContext:
    """The `DistContext` of the current torch.distributed job (single process without one)."""
    first = next(iter(module.parameters()), None)
    device = first.device if first is not None else torch.device("cpu")
    if not dist.is_available() or not dist.is_initialized():
        return DistContext(device=device)
    return DistContext(dist.get_rank(), dist.get_world_size(), 0, device, str(dist.get_backend()))


def model_signature(module: nn.Module) -> Signature:
    """(name, shape, dtype, trainable) of every parameter, in registration order."""
    return [(n, tuple(p.shape), str(p.dtype).replace("torch.", ""), p.requires_grad)
            for n, p in module.named_parameters()]


def first_difference(ref: Signature, other: Signature) -> str | None:
    """A sentence naming the first difference between two signatures, or None."""
    for i, (a, b) in enumerate(zip(ref, other)):
        if a != b:
            what = ["name", "shape", "dtype", "requires_grad"]
            field = next(k for k, x, y in zip(what, a, b) if x != y)
            return f"parameter #{i} {a[0]!r}: {field} {a[_idx(field)]} on rank 0 but {b[_idx(field)]}"
    if len(ref) != len(other):
        return f"{len(ref)} parameters on rank 0 but {len(other)}"
    return None


def _idx(field: str) -> int:
    return ["name", "shape", "dtype", "requires_grad"].index(field)


def check_same_model(module: nn.Module, ctx: DistContext) -> None:
    """Raise `ConfigError` on every rank unless all ranks hold the same model structure."""
    if ctx.world_size == 1 or not dist.is_initialized():
        return
    mine = model_signature(module)
    every: list[Signature | None] = [None] * ctx.world_size
    dist.all_gather_object(every, mine)
    problems = []
    for rank, sig in enumerate(every):
        diff = first_difference(every[0] or [], sig or [])
        if diff:
            problems.append(f"{diff} on rank {rank}")
    if problems:
        raise ConfigError("DataParallel needs the same model on every rank (same parameters, "
                          "shapes, dtypes and requires_grad, in the same order): "
                          + "; ".join(problems) + ". Build the model identically everywhere and "
                          "freeze parameters before wrapping it")
