"""A float64 reference of one training step of an MLP and the bound on an fp32 step's error.

`step_reference` runs the step (Linear / ReLU / Flatten blocks, mean cross-entropy) in
float64 and, alongside, two bounds on |computed - exact| of every value an fp32 step
computes, layer by layer (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd
ed., sections 3.1 and 3.5): E, element-wise, and r, the 2-norm of each sample's row; each
caps the other (|e_ij| <= ||e_i||).

* a sum or dot product of n terms, in any order and any blocking, with each operation
  rounding within u (round to nearest, fused multiply-adds included), is within
  gamma_n = n u / (1 - n u) of the exact value times the sum of the terms' magnitudes;
* Linear, z = a W^T + b (n inputs): the input's error passes through |W| (through ||W||_2
  for r) and the n products plus the bias round: E_z = E_a |W|^T + gamma_{n+1} ((|a| +
  E_a) |W|^T + |b|), r_z = ||W||_2 r_a + gamma_{n+1} (|| |a| |W|^T + |b| || + |||W|||_2 r_a);
* ReLU is 1-Lipschitz: the bounds stay; its backward keeps a gradient where z > 0, and
  where |z| <= E_z the computed z may have the other sign, so there the whole gradient
  (|g| + E_g) is the bound (r: plus the 2-norm of those gradients);
* cross-entropy: the log-softmax of the computed logits is within |e_j| + max_k |e_k| of
  the exact one (logsumexp is 1-Lipschitz in the max-norm), plus its own rounding
  (`logit_gradient`); exp and log within `ELEMENTARY` u (2 ulps: CUDA's documented maximum
  for expf and logf; the CPU's vectorised ones are within 1); the gradient (softmax - onehot)
  / B follows;
* backward Linear: grad W = g^T a (B terms), grad b = sum over the batch (B terms), grad a
  = g W (out terms), each the error of its inputs through the product plus gamma of its
  length times the magnitudes; a parameter's gradient gets an element-wise bound and a
  Frobenius one (the sum over samples of the outer products' errors).

The weights and inputs are the same fp32 numbers on both sides (exact in float64); the
reference's own error is this bound at u = 2^-53, which `u = U32 + U64` covers (every term
grows at least linearly in u). TF32 (10 mantissa bits) is not fp32: a GPU check switches it
off, or its error is not within this bound.

Worst-case bounds compound: propagated through |W| and ||W||_2 layer by layer they widen
towards the input. On the digits MLP (`tests/helpers/first_step.py`) the first step's
fp32 error uses under 1/1000 of them; the classifier's gradient is bounded to within about
1 % of its norm, the first layer's only to a few times its norm. What the check can tell
apart is what `tests/unit/test_step_oracle.py` shows fails it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from tests.helpers.collective_oracles import U32

U64 = 2.0 ** -53
#: exp and log within this many units of u relative (2 ulps = 4 u)
ELEMENTARY = 4.0


def gamma(n: int, u: float) -> float:
    """Higham's gamma_n: n terms summed in any order are within gamma_n times the sum of
    their magnitudes of the exact sum."""
    if n * u >= 1:
        raise ValueError(f"gamma_{n} is unbounded at u = {u}: n u = {n * u} >= 1")
    return n * u / (1 - n * u)


@dataclass(frozen=True)
class StepReference:
    """The exact (float64) gradients of one step by parameter name, and how far an fp32
    step's may be from them: element-wise (`bounds`) and in the Frobenius norm (`norms`)."""

    grads: dict[str, torch.Tensor]
    bounds: dict[str, torch.Tensor]
    norms: dict[str, float]


@dataclass(frozen=True)
class Err:
    """Two bounds on the error of a (batch, features) value: each element's, and each row's
    (one sample's) 2-norm; each tightens the other (|e_ij| <= ||e_i||)."""

    elem: torch.Tensor
    row: torch.Tensor

    @staticmethod
    def of(elem: torch.Tensor, row: torch.Tensor) -> Err:
        row = torch.minimum(row, _rows(elem))
        return Err(torch.minimum(elem, row.view(-1, *[1] * (elem.dim() - 1))), row)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1).norm(dim=1)


def _norms(w: torch.Tensor) -> tuple[float, float]:
    """Upper bounds on the 2-norms of W (its largest singular value, which float64's
    backward-stable SVD gives within far less than 2^-40 relative) and of |W| (at most
    sqrt(||.||_1 ||.||_inf)), for rows e: ||e W^T|| <= ||W|| ||e||."""
    a = w.abs()
    return (float(torch.linalg.svdvals(w)[0]) * (1 + 2 ** -40),
            float((a.sum(0).max() * a.sum(1).max()).sqrt()))


#: a layer on the forward's tape: (name, layer, its input or pre-activation, its bound, and
#: a Linear's `_norms`)
Taped = tuple[str, nn.Module, torch.Tensor, Err, tuple[float, float]]


def _linear(a: torch.Tensor, err: Err, layer: nn.Linear, norms: tuple[float, float], u: float
            ) -> tuple[torch.Tensor, Err]:
    w = layer.weight.detach().double()
    b = layer.bias.detach().double() if layer.bias is not None else None
    bias = b.abs() if b is not None else 0.0
    g = gamma(w.shape[1] + (b is not None), u)
    elem = err.elem @ w.abs().T + g * ((a.abs() + err.elem) @ w.abs().T + bias)
    row = norms[0] * err.row + g * (_rows(a.abs() @ w.abs().T + bias) + norms[1] * err.row)
    return F.linear(a, w, b), Err.of(elem, row)


def _forward(model: nn.Module, x: torch.Tensor, u: float) -> tuple[torch.Tensor, Err, list[Taped]]:
    a = x.detach().double()
    err = Err(torch.zeros_like(a), torch.zeros(a.shape[0], dtype=a.dtype))
    tape: list[Taped] = []
    for name, layer in model.named_modules():
        if list(layer.children()):
            continue
        norms = _norms(layer.weight.detach().double()) if isinstance(layer, nn.Linear) else (0.0, 0.0)
        tape.append((name, layer, a, err, norms))  # a ReLU's input decides its mask
        if isinstance(layer, nn.Flatten | nn.Identity) or (
                isinstance(layer, nn.Dropout) and layer.p == 0):
            a, err = layer(a), Err(layer(err.elem), err.row)
        elif isinstance(layer, nn.Linear):
            a, err = _linear(a, err, layer, norms, u)
        elif isinstance(layer, nn.ReLU):
            a = a.clamp_min(0)  # 1-Lipschitz: the bound stays
        else:
            raise TypeError(f"step_reference knows Linear, ReLU, Flatten and Identity, "
                            f"not {name}: {type(layer).__name__}")
    return a, err, tape


def logit_gradient(z: torch.Tensor, err: Err, y: torch.Tensor, u: float
                    ) -> tuple[torch.Tensor, Err]:
    """d(mean cross-entropy)/dz = (softmax(z) - onehot) / B and its bound. The computed
    log-softmax is d_j - log S with d = z - max z and S = sum_k exp(d_k) (or z_j - (max z +
    log S)): its arguments round within u (|z_j| + 2 |max z| + log S), S within rho (C
    terms, each exp within ELEMENTARY u of exp of an argument off by u |d_k|), log S
    within rho / (1 - rho) plus log's own ELEMENTARY u log S, the result within u of
    itself; exp of it within ELEMENTARY u; then -1/B, one product and one difference.
    Row-wise, softmax is 1/2-Lipschitz in the 2-norm (its Jacobian diag(s) - s s^T has
    Gershgorin radii 2 s_j (1 - s_j) <= 1/2), plus those roundings' 2-norm."""
    batch, classes = z.shape
    ez = err.elem
    ls = torch.log_softmax(z, 1)
    s = ls.exp()
    onehot = F.one_hot(y, classes).double()
    m = ez.amax(1, keepdim=True)
    top = z.amax(1, keepdim=True).abs() + m
    spread = (z - z.amax(1, keepdim=True)).abs().amax(1, keepdim=True) + 2 * m
    rho = (1 + gamma(classes - 1, u)) * (1 + ELEMENTARY * u) * torch.exp(u * spread) - 1
    log_s = math.log(classes) + rho / (1 - rho)
    moved = ez + m  # the exact log-softmax of the computed logits is within this
    rounded = u * (z.abs() + ez + 2 * top + log_s) + rho / (1 - rho) + ELEMENTARY * u * log_s
    rounded = rounded + u * (ls.abs() + moved + rounded)
    s_up = s * torch.exp(moved)  # the computed logits' softmax is at most this
    e_s = s * ((1 + ELEMENTARY * u) * torch.exp(moved + rounded) - 1)
    e_round = s_up * ((1 + ELEMENTARY * u) * torch.exp(rounded) - 1)
    elem = (e_s + gamma(3, u) * (s + e_s + onehot)) / batch
    row = err.row / (2 * batch) + _rows((e_round + gamma(3, u) * (s_up + e_round + onehot)) / batch)
    return (s - onehot) / batch, Err.of(elem, row)


def _weight_bounds(g: torch.Tensor, eg: Err, a: torch.Tensor, ea: Err, u: float
                   ) -> tuple[torch.Tensor, float, torch.Tensor, float]:
    """grad W = g^T a and grad b = sum_i g_i over the batch's B rows: element-wise and
    Frobenius bounds (an outer product's norm is the product of its factors' norms)."""
    gb = gamma(a.shape[0], u)
    gm, am = g.abs() + eg.elem, a.abs() + ea.elem
    w_elem = eg.elem.T @ a.abs() + g.abs().T @ ea.elem + eg.elem.T @ ea.elem + gb * (gm.T @ am)
    gn, an = _rows(g), _rows(a)
    w_norm = (1 + gb) * float((eg.row * an + gn * ea.row + eg.row * ea.row).sum()) \
        + gb * float((g.abs().T @ a.abs()).norm())
    b_elem = eg.elem.sum(0) + gb * gm.sum(0)
    b_norm = (1 + gb) * float(eg.row.sum()) + gb * float(g.abs().sum(0).norm())
    return w_elem, w_norm, b_elem, b_norm


def _backward(tape: list[Taped], g: torch.Tensor, eg: Err, u: float) -> StepReference:
    grads: dict[str, torch.Tensor] = {}
    bounds: dict[str, torch.Tensor] = {}
    norms: dict[str, float] = {}
    for name, layer, a, ea, (w_norm2, abs_norm2) in reversed(tape):
        if isinstance(layer, nn.ReLU):
            on = (a > 0).double()
            unsure = a.abs() <= ea.elem  # the computed input may have the other sign
            eg = Err.of(torch.where(unsure, g.abs() + eg.elem, eg.elem * on),
                        eg.row + _rows(g * unsure))
            g = g * on
        elif isinstance(layer, nn.Linear):
            prefix = f"{name}." if name else ""
            grads[prefix + "weight"] = g.T @ a
            w_elem, w_norm, b_elem, b_norm = _weight_bounds(g, eg, a, ea, u)
            bounds[prefix + "weight"], norms[prefix + "weight"] = w_elem, w_norm
            if layer.bias is not None:
                grads[prefix + "bias"] = g.sum(0)
                bounds[prefix + "bias"], norms[prefix + "bias"] = b_elem, b_norm
            w = layer.weight.detach().double()
            ga = gamma(w.shape[0], u)
            elem = eg.elem @ w.abs() + ga * ((g.abs() + eg.elem) @ w.abs())
            row = w_norm2 * eg.row + ga * (_rows(g.abs() @ w.abs()) + abs_norm2 * eg.row)
            g, eg = g @ w, Err.of(elem, row)
        else:  # Flatten, Identity: back to the input's shape
            g, eg = g.reshape(a.shape), Err(eg.elem.reshape(a.shape), eg.row)
    return StepReference(grads, bounds, norms)


def step_reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                   u: float = U32 + U64) -> StepReference:
    """The gradients of mean cross-entropy of `model` on (`x`, `y`) in float64 and the bounds
    on an fp32 step's gradients (unit roundoff `u`); `model`'s weights are read, not
    changed."""
    z, ez, tape = _forward(model, x, u)
    g, eg = logit_gradient(z, ez, y.detach().cpu(), u)
    return _backward(tape, g, eg, u)


def excess(grads: dict[str, torch.Tensor], ref: StepReference) -> dict[str, float]:
    """Per parameter, |grad - reference| over its bound, the larger of the element-wise
    (the largest element's) and the Frobenius ratio (<= 1: within both bounds); a parameter
    missing from `grads` is an error."""
    if set(grads) != set(ref.grads):
        raise KeyError(f"gradients of {sorted(grads)}, the reference has {sorted(ref.grads)}")
    out = {}
    for name, want in ref.grads.items():
        diff = (grads[name].detach().cpu().double() - want).abs()
        elem = float((diff / ref.bounds[name]).nan_to_num(0.0, posinf=math.inf).max())
        norm = float(diff.norm()) / ref.norms[name] if ref.norms[name] else (
            math.inf if float(diff.norm()) else 0.0)
        out[name] = max(elem, norm)
    return out


def outside(grads: dict[str, torch.Tensor], ref: StepReference) -> dict[str, float]:
    """The parameters whose gradient is outside a bound, with `excess`."""
    return {name: worst for name, worst in excess(grads, ref).items() if worst > 1.0}
