"""What every rank must agree on before data parallelism can start, with errors that say why.

Seed 001 starts from identical replicas ("weights broadcast at start; same random seed on
all nodes"). Broadcasting weights needs the same *structure* everywhere: the same
parameter names, shapes, dtypes and trainable flags in the same order. `check_same_model`
compares them across ranks once, at construction, and raises the same error on every
rank naming the first difference — instead of a hang or a silent wrong sum later. The
check runs over the engine's group (any set of ranks); messages name global ranks.
"""

from __future__ import annotations

import torch
from torch import nn

from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext, current_context
from approxdist.launch.group import Group

Signature = list[tuple[str, tuple[int, ...], str, bool]]


def context_of(module: nn.Module) -> DistContext:
    """The `DistContext` of the current job, on the device of `module`'s parameters."""
    first = next(iter(module.parameters()), None)
    return current_context(first.device if first is not None else torch.device("cpu"))


def model_signature(module: nn.Module) -> Signature:
    """(name, shape, dtype, trainable) of every parameter, in registration order."""
    return [(n, tuple(p.shape), str(p.dtype).replace("torch.", ""), p.requires_grad)
            for n, p in module.named_parameters()]


def first_difference(ref: Signature, other: Signature, root: int = 0) -> str | None:
    """A sentence naming the first difference between two signatures, or None
    (`ref` is rank `root`'s)."""
    for i, (a, b) in enumerate(zip(ref, other)):
        if a != b:
            what = ["name", "shape", "dtype", "requires_grad"]
            field = next(k for k, x, y in zip(what, a, b) if x != y)
            return (f"parameter #{i} {a[0]!r}: {field} {a[_idx(field)]} on rank {root} but "
                    f"{b[_idx(field)]}")
    if len(ref) != len(other):
        return f"{len(ref)} parameters on rank {root} but {len(other)}"
    return None


def _idx(field: str) -> int:
    return ["name", "shape", "dtype", "requires_grad"].index(field)


def check_same_model(module: nn.Module, group: Group, who: str = "DataParallel") -> None:
    """Raise `ConfigError` on every member unless all members hold the same model structure
    (`who` is the API that needs it, for the message)."""
    if not group.distributed:
        return
    every: list[Signature] = group.all_gather_object(model_signature(module))
    problems = []
    for rank, sig in zip(group.ranks, every):
        diff = first_difference(every[0], sig, group.root)
        if diff:
            problems.append(f"{diff} on rank {rank}")
    if problems:
        raise ConfigError(f"{who} needs the same model on every rank (same parameters, "
                          "shapes, dtypes and requires_grad, in the same order): "
                          + "; ".join(problems) + ". Build the model identically everywhere and "
                          "freeze parameters before wrapping it")
