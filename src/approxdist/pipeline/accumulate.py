"""Fused weight-gradient accumulation across micro-batches (Megatron-LM's
`gradient_accumulation_fusion`, on any `nn.Linear`).

With M micro-batches every stage accumulates M weight gradients per step. Autograd does
it in two passes per layer and micro-batch: the GEMM writes `g^T x` into a fresh tensor,
then `AccumulateGrad` adds that tensor to `.grad` (reading both, writing one). For a
layer of W weights that is an extra 3W floats of memory traffic, plus the allocation,
per micro-batch; on small micro-batches it costs as much as the GEMM itself (1024x1024
layers, 8 rows: ~1.3x faster forward + backward with fusion, docs/pipeline.md).

`WeightGradFusion(module, min_weights)` gives every plain `nn.Linear` inside `module`
with at least `min_weights` weights (`MIN_WEIGHTS` = 2^19 by default) a forward that,
*only inside* `fusion.active()` and with grad mode on, runs `_LinearAccumulate`: its
backward computes the input gradient as usual and adds the weight (and bias) gradient
straight into `.grad` with one `addmm_` (`mm` on the first micro-batch). The values are
those of autograd up to float rounding order. Outside `active()` the layers run
`nn.Linear.forward` untouched.

A weight falls back to plain autograd when the fused path would change what a user
sees: it is not a leaf or does not require grad, it has post-accumulate-grad hooks (a
data-parallel engine's), its dtype differs from the input's, or its `.grad` is not a
plain dense tensor of its own dtype. A backward with `create_graph=True` through a fused
layer raises (it would drop the weights' part of the graph), and
`torch.autograd.grad(..., weight)` would not see the weight inside `active()`: the
pipeline stage only ever calls `backward()`.

A split backward (zero-bubble schedules) defers instead: inside `active(defer=store,
key=m)` a fused layer's backward computes only the input gradient and keeps `(x, g)` in
`store` (a `DeferredWeightGrads`) under micro-batch `m`; the layer's weight is not in the
autograd graph at all, so `I` never sees it. A layer whose input needs no gradient (the
first layer of the first stage) is off every input path, runs only in `W`, and accumulates
there at once. `store.flush(keys)` is `W`: one GEMM per layer
over the concatenated rows of every micro-batch in `keys` (`grad += cat(g)^T cat(x)`), so
`W`s that follow each other in a schedule cost one pass over each weight gradient, not one
per micro-batch.

An asynchronous stream's step takes the rows too (`active(defer=store, key=m, every=True)`,
`StageCompute.defer_weights`): there every fused layer keeps its rows, the first one of the
first stage included (its node enters the graph through its weight, which gets no
`.grad`), and the step runs the GEMMs (`optim.step_into`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.optim.step_into import Rows

_FLAG = "_approxdist_fused_accumulation"
#: `auto` fuses layers of at least this many weights (2 MiB of fp32 gradient): below it
#: the accumulation pass stays in a core's L2 cache and the Python of a custom autograd
#: function costs as much as it saves (measured, docs/pipeline.md)
MIN_WEIGHTS = 1 << 19
#: `fuse_accumulation` settings: the smallest layer each one fuses (None: no fusion)
MODES = {"auto": MIN_WEIGHTS, "all": 0, "off": None}


class _LinearAccumulate(torch.autograd.Function):
    """`F.linear` whose backward accumulates the parameter gradients into `.grad` itself."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: nn.Parameter,
                bias: nn.Parameter | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)  # version-checked: an update before backward raises
        ctx.params = (weight, bias)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        if torch.is_grad_enabled():  # backward(create_graph=True): no graph through .grad
            raise RuntimeError("fused weight-gradient accumulation cannot build a graph of the "
                               "gradients (create_graph=True); run this stage with "
                               "fuse_accumulation='off' (--fuse-accumulation off)")
        x, w = ctx.saved_tensors
        weight, bias = ctx.params
        grad_in = grad.matmul(w) if ctx.needs_input_grad[0] else None
        _accumulate(weight if ctx.needs_input_grad[1] else None,
                    bias if ctx.needs_input_grad[2] else None,
                    x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1]))
        return grad_in, None, None


def _accumulate(weight: torch.Tensor | None, bias: torch.Tensor | None, x: torch.Tensor,
                g: torch.Tensor) -> None:
    """`weight.grad += g^T x` in one GEMM (`mm` when there is none yet), `bias.grad += sum g`."""
    if weight is not None:
        if weight.grad is None:
            weight.grad = torch.mm(g.t(), x)
        else:
            weight.grad.addmm_(g.t(), x)
    if bias is not None:
        if bias.grad is None:
            bias.grad = g.sum(0)
        else:
            bias.grad.add_(g.sum(0))


class _LinearDefer(torch.autograd.Function):
    """`F.linear` of `layer` (its parameters outside the graph) whose backward computes the
    input gradient and keeps `(x, g)` for `DeferredWeightGrads.flush`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: nn.Linear, store: DeferredWeightGrads,
                key: int, anchor: torch.Tensor | None = None) -> torch.Tensor:
        # `anchor` (the weight, when `x` needs no gradient) only puts the node in the graph
        weight = layer.weight.detach()  # shares the version counter: an update raises
        ctx.save_for_backward(x, weight)
        ctx.layer, ctx.store, ctx.key = layer, store, key
        bias = layer.bias.detach() if layer.bias is not None else None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any,
                 grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None, None]:
        if torch.is_grad_enabled():
            raise RuntimeError("a deferred weight gradient cannot build a graph of the "
                               "gradients (create_graph=True); run this stage with "
                               "fuse_accumulation='off' (--fuse-accumulation off)")
        x, w = ctx.saved_tensors
        ctx.store.keep(ctx.key, ctx.layer, x.detach().reshape(-1, x.shape[-1]),
                       grad.reshape(-1, grad.shape[-1]))
        return (grad.matmul(w) if ctx.needs_input_grad[0] else None), None, None, None, None


class DeferredWeightGrads:
    """Weight-gradient GEMMs of fused layers kept by `I`, run by `flush` (`W`)."""

    def __init__(self) -> None:
        #: micro-batch -> (layer, its input rows, its output-gradient rows), in backward order
        self.pending: dict[int, list[tuple[nn.Linear, torch.Tensor, torch.Tensor]]] = {}

    def keep(self, key: int, layer: nn.Linear, x: torch.Tensor, g: torch.Tensor) -> None:
        self.pending.setdefault(key, []).append((layer, x, g))

    def take(self, keys: Iterable[int]) -> list[tuple[nn.Linear, list[Rows]]]:
        """The kept rows of micro-batches `keys`, taken out: per layer, the `(x, g)` of each
        (its weight gradient is the sum of their `g^T x`)."""
        rows: dict[int, tuple[nn.Linear, list[Rows]]] = {}
        for key in keys:
            for layer, x, g in self.pending.pop(key, []):
                rows.setdefault(id(layer), (layer, []))[1].append((x, g))
        return list(rows.values())

    def nbytes(self, key: int) -> int:
        """Bytes of the rows kept for micro-batch `key`."""
        return sum(t.nelement() * t.element_size() for _, x, g in self.pending.get(key, [])
                   for t in (x, g))

    @torch.no_grad()
    def flush(self, keys: Iterable[int]) -> None:
        """Accumulate the kept gradients of micro-batches `keys` into `.grad`: one GEMM per
        layer over all of their rows."""
        for layer, pairs in self.take(keys):
            xs, gs = [x for x, _ in pairs], [g for _, g in pairs]
            _accumulate(layer.weight, layer.bias, xs[0] if len(xs) == 1 else torch.cat(xs),
                        gs[0] if len(gs) == 1 else torch.cat(gs))


def _accumulates_plainly(p: torch.Tensor | None, dtype: torch.dtype) -> bool:
    """Whether writing `p.grad` ourselves is what `AccumulateGrad` would do for `p`."""
    if p is None:
        return True
    if not (p.is_leaf and p.requires_grad and p.dtype == dtype):
        return False
    if getattr(p, "_post_accumulate_grad_hooks", None):
        return False
    g = p.grad
    return g is None or (g.layout == torch.strided and g.dtype == p.dtype
                         and g.shape == p.shape and not g.requires_grad)


def _forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    mode = module.__dict__[_FLAG]
    if mode and torch.is_grad_enabled() and x.dtype == module.weight.dtype:
        if isinstance(mode, tuple) and x.requires_grad:  # else no I reaches the layer
            return _LinearDefer.apply(x, module, *mode[:2])
        if isinstance(mode, tuple) and mode[2]:  # a stream's step: rows of every layer
            return _LinearDefer.apply(x, module, *mode[:2], module.weight)
        return _LinearAccumulate.apply(x, module.weight, module.bias)
    return nn.Linear.forward(module, x)


class WeightGradFusion:
    """Fused accumulation for the plain `nn.Linear` layers of `module` holding at least
    `min_weights` weights (module docstring)."""

    def __init__(self, module: nn.Module, min_weights: int = MIN_WEIGHTS) -> None:
        self.layers = [m for m in module.modules()
                       if isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward
                       and m.weight.numel() >= min_weights]
        for m in self.layers:
            setattr(m, _FLAG, False)
            m.forward = functools.partial(_forward, m)  # type: ignore[method-assign]

    @property
    def weights(self) -> int:
        """How many weights the fused layers hold."""
        return sum(m.weight.numel() for m in self.layers)

    @contextlib.contextmanager
    def active(self, defer: DeferredWeightGrads | None = None, key: int = 0,
               every: bool = False) -> Iterator[None]:
        """Forwards inside the block record fused backward nodes (for the layers whose
        parameters `AccumulateGrad` would treat plainly right now); with `defer`, nodes
        that keep their weight gradients in `defer` under `key` (module docstring); with
        `every` too, the layers whose input needs no gradient also keep theirs (an
        asynchronous stream's step takes every layer's rows) instead of accumulating."""
        for m in self.layers:
            dtype = m.weight.dtype
            plain = _accumulates_plainly(m.weight, dtype) and _accumulates_plainly(m.bias, dtype)
            setattr(m, _FLAG, (defer, key, every) if plain and defer is not None else plain)
        try:
            yield
        finally:
            for m in self.layers:
                setattr(m, _FLAG, False)

    def remove(self) -> None:
        """Give the layers back their own forward."""
        for m in self.layers:
            m.__dict__.pop("forward", None)
            m.__dict__.pop(_FLAG, None)
        self.layers = []
