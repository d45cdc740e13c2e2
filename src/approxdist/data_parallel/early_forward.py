"""Early forward: apply the user's optimizer to each bucket as soon as its mean arrives (seed 001).

Seed 001: "copy back and compute the update, apply the update" on the communication
threads, so the next forward of a layer waits only for that layer. The update must be
exactly the user's `optimizer.step()` (momentum, weight decay, nesterov, any torch
optimizer). How:

* one *shadow* optimizer per bucket, of the user's class, over *proxies*: tensors that
  share storage with the bucket's parameters (`p.detach()`), so a shadow step writes the
  real weights while the proxies' `.grad` (the reduced mean, a view of the bucket) is
  private to the engine — a user `zero_grad()` on the main thread cannot race with it;
* the shadow's per-parameter state *is* the user's: before each step
  `shadow.state[proxy] = optimizer.state[param]` (the same dict object), so momentum
  buffers live in the user's optimizer, appear in its `state_dict()` and survive
  `load_state_dict()`;
* hyper-parameters (lr, momentum, ...) are snapshot from the user's param groups when
  backward starts (`snapshot()`, main thread), so an LR rule that sets the next step's lr
  before the next forward never leaks into this step's updates.
Parameters outside the optimizer are reduced but not stepped, as `optimizer.step()`
would leave them. The user must not call `optimizer.step()` (it raises).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from approxdist.data_parallel.reducer import BucketState
from approxdist.errors import ConfigError


class _Shadow:
    """The shadow optimizer of one bucket and the mapping back to the user's groups."""

    def __init__(self, optimizer: torch.optim.Optimizer, bucket: BucketState,
                 group_of: dict[int, int]) -> None:
        slots: dict[int, list[int]] = {}
        for slot, p in enumerate(bucket.params):
            if id(p) in group_of:
                slots.setdefault(group_of[id(p)], []).append(slot)
        self.groups = sorted(slots)
        self.slots = [slots[g] for g in self.groups]
        self.proxies = {s: bucket.params[s].detach() for g in self.slots for s in g}
        self.optimizer: torch.optim.Optimizer | None = None
        if self.groups:
            groups = [{"params": [self.proxies[s] for s in ss]} for ss in self.slots]
            try:
                self.optimizer = type(optimizer)(groups, **_constructor_defaults(optimizer))
            except TypeError as exc:
                raise ConfigError(f"early forward cannot rebuild optimizer "
                                  f"{type(optimizer).__name__} from its defaults ({exc}); "
                                  f"use early_forward=False with this optimizer") from exc


class StepApplier:
    """Applies the user's optimizer step bucket by bucket, on the communication threads."""

    def __init__(self, optimizer: torch.optim.Optimizer, buckets: Sequence[BucketState]) -> None:
        self.optimizer = optimizer
        group_of = {id(p): gi for gi, g in enumerate(optimizer.param_groups) for p in g["params"]}
        self._shadows = {id(b): _Shadow(optimizer, b, group_of) for b in buckets}
        self._hyper: list[dict[str, Any]] = []
        self.snapshot()
        self._guard = optimizer.register_step_pre_hook(_refuse_step)

    def snapshot(self) -> None:
        """Freeze the user's hyper-parameters for the updates of the current backward pass."""
        self._hyper = [{k: v for k, v in g.items() if k != "params"}
                       for g in self.optimizer.param_groups]

    def apply(self, bucket: BucketState, used: Sequence[bool] | None = None) -> None:
        """One optimizer step on `bucket`'s parameters with its reduced gradients.

        `used[slot]` False (no rank produced a gradient) leaves that parameter untouched,
        as `optimizer.step()` skips parameters whose `.grad` is None.
        """
        shadow = self._shadows[id(bucket)]
        if shadow.optimizer is None:
            return
        state = self.optimizer.state
        for sg, gi, slots in zip(shadow.optimizer.param_groups, shadow.groups, shadow.slots):
            sg.update(self._hyper[gi])
            for s in slots:
                proxy = shadow.proxies[s]
                shadow.optimizer.state[proxy] = state[bucket.params[s]]
                grad = bucket.views[s] if used is None or used[s] else None
                proxy.grad = grad if grad is None or grad.dtype == proxy.dtype \
                    else grad.to(proxy.dtype)
        try:
            shadow.optimizer.step()
        finally:
            for proxy in shadow.proxies.values():
                proxy.grad = None

    def remove(self) -> None:
        self._guard.remove()


def _constructor_defaults(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's defaults its constructor accepts (some keep extra internal keys)."""
    params = inspect.signature(type(optimizer).__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in params}


def _refuse_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    raise ConfigError("DataParallel(early_forward=True) applies the optimizer step itself as each "
                      "bucket's averaged gradient arrives; remove the optimizer.step() call "
                      "(zero_grad() is not needed either)")
