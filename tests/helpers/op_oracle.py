"""Each operation of a recorded training step against float64 of its own inputs.

`first_step` records what every leaf layer of the step computed on its device: its
input, its output and the gradient backward brought to its output. `op_excess` redoes each
operation in float64 from the device's own fp32 inputs and divides the difference by that
one operation's rounding bound (Higham's gamma_n of its reduction length n times the
magnitudes, as in `step_oracle`, but with no error carried in: the inputs are the
device's):

* Linear: forward gamma_{n+1} (|a| |W|^T + |b|); its weight gradient gamma_B |g|^T |a|, its
  bias gradient gamma_B sum_i |g_i| (B samples), the gradient at its input gamma_out |g| |W|;
* ReLU and Flatten: exact both ways (a ReLU passes the gradient where its output is > 0);
* the loss: the gradient at the logits within `step_oracle.logit_gradient`'s rounding
  bound of (softmax - onehot) / B of the device's logits;
* the chain: the first layer's input is the batch and each layer's input the previous
  one's output, bit for bit (the records are one step of one model).

Nothing compounds, so these bounds stay within a small factor of what fp32 does (n u
against about sqrt(n) u for random rounding): the digits MLP's fp32 step on the CPU uses
at most a third of them (mostly a few per cent), and a matmul on operands rounded to TF32's
10 mantissa bits misses them by 6 to 200 times (`tests/unit/test_step_oracle.py`).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from tests.helpers.collective_oracles import U32
from tests.helpers.first_step import FirstStep
from tests.helpers.step_oracle import U64, Err, gamma, logit_gradient


def _ratio(got: torch.Tensor | None, want: torch.Tensor, bound: torch.Tensor | float) -> float:
    """max |got - want| / bound (0 / 0 counts as 0; a missing value as infinitely far)."""
    if got is None or got.shape != want.shape:
        return math.inf
    diff = (got.double() - want).abs()
    return float((diff / torch.as_tensor(bound, dtype=diff.dtype)).nan_to_num(
        0.0, posinf=math.inf).max()) if diff.numel() else 0.0


def _linear(step: FirstStep, out: dict[str, float], i: int, layer: nn.Linear, u: float) -> None:
    op, w = step.ops[i], layer.weight.detach().double()
    b = layer.bias.detach().double() if layer.bias is not None else None
    a = op.inp.double()
    bias = b.abs() if b is not None else 0.0
    out[f"{op.name} forward"] = _ratio(op.out, F.linear(a, w, b),
                                       gamma(w.shape[1] + (b is not None), u)
                                       * (a.abs() @ w.abs().T + bias))
    if op.grad_out is None:
        out[f"{op.name} gradient"] = math.inf
        return
    g, rows = op.grad_out.double(), a.shape[0]
    prefix = f"{op.name}." if op.name else ""
    out[prefix + "weight"] = _ratio(step.grads.get(prefix + "weight"), g.T @ a,
                                    gamma(rows, u) * (g.abs().T @ a.abs()))
    if b is not None:
        out[prefix + "bias"] = _ratio(step.grads.get(prefix + "bias"), g.sum(0),
                                      gamma(rows, u) * g.abs().sum(0))
    if i and step.ops[i - 1].grad_out is not None:
        out[f"{op.name} input gradient"] = _ratio(step.ops[i - 1].grad_out, g @ w,
                                                  gamma(w.shape[0], u) * (g.abs() @ w.abs()))


def _exact(step: FirstStep, out: dict[str, float], i: int, layer: nn.Module) -> None:
    """ReLU, Flatten, Identity: forward and backward without rounding."""
    op = step.ops[i]
    relu = isinstance(layer, nn.ReLU)
    out[f"{op.name} forward"] = _ratio(op.out, layer(op.inp.double()), 0.0)
    before = step.ops[i - 1].grad_out if i else None
    if before is not None and op.grad_out is not None:
        g = op.grad_out.double()
        want = g * (op.out > 0) if relu else g.reshape(op.inp.shape)
        out[f"{op.name} input gradient"] = _ratio(before, want, 0.0)


def op_excess(step: FirstStep, u: float = U32 + U64) -> dict[str, float]:
    """Per check (`<layer> forward`, `<layer> input gradient`, each parameter, `loss`,
    `chain`): |device - float64 of the device's inputs| over its bound (<= 1: within)."""
    ops, layers = step.ops, dict(step.model.named_modules())
    linked = bool(ops) and torch.equal(ops[0].inp, step.x) and all(
        torch.equal(a.out, b.inp) for a, b in zip(ops, ops[1:]))
    out = {"chain": 0.0 if linked else math.inf}
    for i, op in enumerate(ops):
        layer = layers[op.name]
        if isinstance(layer, nn.Linear):
            _linear(step, out, i, layer, u)
        elif isinstance(layer, nn.ReLU | nn.Flatten | nn.Identity):
            _exact(step, out, i, layer)
        else:
            raise TypeError(f"op_excess knows Linear, ReLU, Flatten and Identity, not "
                            f"{op.name}: {type(layer).__name__}")
    logits = ops[-1].out.double()
    zero = Err(torch.zeros_like(logits), torch.zeros(logits.shape[0], dtype=logits.dtype))
    g, eg = logit_gradient(logits, zero, step.y, u)
    out["loss"] = _ratio(ops[-1].grad_out, g, eg.elem)
    return out


def op_outside(step: FirstStep, u: float = U32 + U64) -> dict[str, float]:
    """The checks of `op_excess` that the step fails."""
    return {name: worst for name, worst in op_excess(step, u).items() if worst > 1.0}
