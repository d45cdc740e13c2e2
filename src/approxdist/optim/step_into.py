"""SGD's step written into other storage than the parameters' own (out of place).

`torch.optim.SGD` updates its parameters in place, so a pipeline stage that must keep the
weights from before a step (PipeDream's weight stashing, 2BW's second version) copies
them first: one more pass over the stage's weights per step, which on PipeDream, with a
step per micro-batch, costs about what the step does. `step_into(optimizer, targets)`
runs `torch.optim.SGD`'s own arithmetic (weight decay, momentum with dampening, Nesterov;
the momentum buffers live in `optimizer.state` as SGD keeps them, so `state_dict` and a
later in-place `step()` continue from them) but writes each parameter's new value into
`targets[i]` and points the parameter there (`p.data = target`): the storage it held
before keeps the old weights, untouched. The values are SGD's: the same operations in
the same order (bit for bit against its single-tensor path, `tests/unit/test_step_into.py`),
only the last one writes elsewhere. A target may be the parameter's own storage (a stage
whose weights from before the step no action uses): then the step is SGD's in-place one.

A parameter's gradient may also come as *rows* (`rows[id(p)] = [(x1, g1), (x2, g2), ...]`:
the gradient is `g1^T x1 + g2^T x2 + ...`, a linear layer's weight gradient over its
micro-batches, not yet computed; `accumulate.DeferredWeightGrads`). The GEMMs then run
inside the step (`_step_rows`): without momentum the first writes the step itself,
`target = (1 - lr*decay) p - lr g1^T x1` (`addmm`: no gradient tensor, one pass over the
weights where a GEMM and SGD's update take three), and the others add into the target in
place; with momentum they add into the buffer,
`buf = momentum buf + (1 - dampening) (sum gi^T xi + decay p)`. Equal to SGD on the
computed gradient up to float rounding; Nesterov computes the gradient first (`torch.mm`).

`steps_into(optimizer)` says whether an optimizer can: a plain `torch.optim.SGD` whose
`step` is neither wrapped (a learning-rate scheduler's counter) nor hooked, without
`maximize`, `differentiable`, `fused` or tensor-valued rates. Any other keeps stepping in
place after a copy (`pipeline.weights`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.optim import optimizer as torch_optimizer

_OFF = ("maximize", "differentiable", "fused")


def steps_into(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `step_into` computes exactly what `optimizer.step()` would (module docstring)."""
    if type(optimizer) is not torch.optim.SGD or "step" in vars(optimizer):
        return False
    hooks = (optimizer._optimizer_step_pre_hooks, optimizer._optimizer_step_post_hooks,
             torch_optimizer._global_optimizer_pre_hooks,
             torch_optimizer._global_optimizer_post_hooks)
    if any(hooks):
        return False
    return all(not group.get(key) for group in optimizer.param_groups for key in _OFF) and \
        all(not isinstance(group[key], torch.Tensor) for group in optimizer.param_groups
            for key in ("lr", "weight_decay", "momentum", "dampening"))


#: the largest block of a weight `_update_from_rows` updates at once on a CPU (a core's L2)
BLOCK_BYTES = 1 << 21
#: one share of a weight gradient as rows: `(x, g)`, the share being `g^T x`
Rows = tuple[torch.Tensor, torch.Tensor]


@torch.no_grad()
def step_into(optimizer: torch.optim.SGD, params: Sequence[torch.Tensor],
              targets: Sequence[torch.Tensor],
              rows: Mapping[int, Sequence[Rows]] | None = None) -> None:
    """One SGD step of `params` written into `targets` (same shapes), each parameter then
    pointing at its target; `rows[id(p)]`: `p`'s gradient as rows instead of `p.grad`
    (module docstring). A parameter without a gradient, or one `optimizer` does not hold,
    keeps its value (copied into its target); `optimizer` holds no other tensors."""
    where = {id(p): (p, t) for p, t in zip(params, targets, strict=True)}
    rows = rows or {}
    for group in optimizer.param_groups:
        decay, momentum, dampening = group["weight_decay"], group["momentum"], group["dampening"]
        for p in group["params"]:
            if id(p) not in where:
                raise ValueError(f"the optimizer holds a parameter of shape {tuple(p.shape)} "
                                 f"that step_into was not given; pass all of its parameters")
            factors = rows.get(id(p))
            if p.grad is None and factors is None:
                continue
            _, target = where.pop(id(p))
            if factors is not None and not group["nesterov"]:
                _step_rows(optimizer, group, p, target, factors)
                p.data = target
                continue
            grad = p.grad if factors is None else rows_product(factors)
            if decay != 0:
                grad = grad.add(p, alpha=decay)
            if momentum != 0:
                state = optimizer.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = grad.detach().clone()
                else:
                    buf.mul_(momentum).add_(grad, alpha=1 - dampening)
                grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
            torch.add(p, grad, alpha=-group["lr"], out=target)
            p.data = target
    for p, target in where.values():  # SGD leaves it as it is
        if not _same(target, p):
            target.copy_(p)
        p.data = target


def rows_product(rows: Sequence[Rows]) -> torch.Tensor:
    """The gradient `rows` stand for: the sum of their `g^T x`."""
    (x, g), rest = rows[0], rows[1:]
    out = torch.mm(g.t(), x)
    for x, g in rest:
        out.addmm_(g.t(), x)
    return out


def _step_rows(optimizer: torch.optim.SGD, group: dict[str, Any], p: torch.Tensor,
               target: torch.Tensor, rows: Sequence[Rows]) -> None:
    """SGD's step of `p` into `target` with the gradient `rows` stand for, its GEMMs inside
    the update."""
    lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
    (x, g), rest = rows[0], rows[1:]
    if momentum == 0:
        _update_from_rows(p, target, rows, 1 - lr * decay, -lr)
        return
    state, damp = optimizer.state[p], 1 - group["dampening"]
    buf = state.get("momentum_buffer")
    if buf is None:  # SGD's first buffer is the gradient, undamped
        buf = state["momentum_buffer"] = rows_product(rows)
        if decay != 0:
            buf.add_(p, alpha=decay)
    else:
        buf.addmm_(g.t(), x, beta=momentum, alpha=damp)
        for x, g in rest:
            buf.addmm_(g.t(), x, alpha=damp)
        if decay != 0:
            buf.add_(p, alpha=damp * decay)
    torch.add(p, buf, alpha=-lr, out=target)


def _update_from_rows(p: torch.Tensor, target: torch.Tensor, rows: Sequence[Rows],
                      beta: float, alpha: float) -> None:
    """`target = beta p + alpha sum g^T x` for a linear layer's weight `p`. Out of place on
    a CPU it goes by blocks of rows of at most `BLOCK_BYTES`: each block of `p` is copied
    into `target` and the GEMMs update it while it is still in the core's cache (one GEMM
    over the whole matrix reads the copy back from memory: blocks took 0.84x its time at
    1024 x 1024 and 16 rows, same values)."""
    in_place = _same(target, p)
    block = p.shape[0] if in_place or p.device.type != "cpu" else \
        max(1, BLOCK_BYTES // max(1, p.shape[1] * p.element_size()))
    for i in range(0, p.shape[0], block):
        t, first = target[i:i + block], beta
        if not in_place:
            t.copy_(p[i:i + block])
        for x, g in rows:
            t.addmm_(g.t()[i:i + block], x, beta=first, alpha=alpha)
            first = 1.0


def _same(target: torch.Tensor, p: torch.Tensor) -> bool:
    """Whether `target` is `p`'s own storage (an in-place step)."""
    return target.data_ptr() == p.data_ptr()
