"""What the asynchronous-schedule oracles share (`tests/dist/test_async_oracle.py` and
`test_async_hybrid_oracle.py`): the model, the data of each mini-batch, the optimizer
(also one that records every step it takes) and a parameter snapshot the replays
differentiate through."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from approxdist.models.mlp import mlp

FEATURES, CLASSES, HIDDEN = 12, 5, 16
LR, MOMENTUM, DECAY = 0.05, 0.9, 5e-4


class HasBatch(Protocol):
    @property
    def batch(self) -> int: ...


def oracle_model() -> nn.Sequential:
    torch.manual_seed(0)
    return mlp((FEATURES,), CLASSES, hidden=HIDDEN, depth=4)  # 5 blocks, no batch norm


def minibatch(case: HasBatch, epoch: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * epoch + b)
    return (torch.randn(case.batch, FEATURES, generator=gen),
            torch.randint(0, CLASSES, (case.batch,), generator=gen))


def sgd(module: nn.Module, plain: bool = False) -> torch.optim.SGD:
    """The oracles' SGD (momentum, weight decay); `plain`: neither (the GEMM-written step)."""
    if plain:
        return torch.optim.SGD(module.parameters(), lr=LR)
    return torch.optim.SGD(module.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=DECAY)


class RecordingSGD(torch.optim.SGD):
    """`sgd(module)` that keeps, for every step, the gradients it applied and the
    parameters after it (by name), so a test can check a run step by step."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=DECAY)
        self.named = list(module.named_parameters())
        self.steps: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = []

    def step(self, closure: Any = None) -> Any:
        grads = {n: p.grad.detach().clone() for n, p in self.named if p.grad is not None}
        out = super().step(closure)
        self.steps.append((grads, {n: p.detach().clone() for n, p in self.named}))
        return out


def hooked_sgd(module: nn.Module) -> torch.optim.SGD:
    """`sgd` with a step hook: the same steps, taken in place (`optim.step_into` does not
    stand in for a hooked optimiser), so a stage copies each version it keeps."""
    opt = sgd(module)
    opt.register_step_pre_hook(lambda *_: None)
    return opt


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone().requires_grad_(True) for n, t in module.named_parameters()}


def train_streams(rt: Any, case: HasBatch, minibatches: int, epochs: int = 2,
                  optimizer: torch.optim.Optimizer | None = None,
                  in_place: bool = False) -> list[tuple[float, int]]:
    """Bind `optimizer` (default `sgd`; `in_place`: a hooked one, `hooked_sgd`) to a
    runtime's stream (its schedule's `U` actions step it) and train `epochs` streams of
    `minibatches` (each epoch one stream, none left in flight); (loss, samples) per step."""
    stream = rt.executor.stream
    assert stream is not None
    stream.bind(optimizer if optimizer is not None else
                (hooked_sgd if in_place else sgd)(rt.module))
    first, last = rt.transport.is_first, rt.transport.is_last
    losses = []
    for epoch in range(epochs):
        for b in range(minibatches):
            x, y = minibatch(case, epoch, b)
            res = rt.executor.train_step(x if first else None, y if last else None, case.batch)
            losses.append((res.loss, res.samples))
        assert not stream.in_stream
    return losses
