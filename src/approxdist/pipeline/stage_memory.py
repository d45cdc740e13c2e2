"""The activation memory a pipeline stage holds for backward: stored inputs plus the tensors
autograd saves (parameters excluded, shared storage counted once); its `peak` over a step is
the number `--recompute` reduces."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


class ActivationMemory:
    """Live and peak bytes a stage keeps for backward (inputs + autograd-saved activations).

    The saved bytes are measured with autograd's saved-tensor hooks the first time an
    input shape is seen (per dtype and train/eval mode) and reused afterwards: the hooks
    run Python for every saved tensor in forward *and* backward, which cost ResNet-20's
    two-stage pipeline 4-6 % of its step. A model whose saved activations change with the
    values of its input, not just their shape, would be reported at its first size.
    """

    def __init__(self, module: nn.Module) -> None:
        """`module`'s parameters are not activations; a rank's stages (chunks) share one
        memory (`exclude` the others' parameters) and name their `owner` in `saved`."""
        self.module = module
        self._params = {p.untyped_storage().data_ptr() for p in module.parameters()}
        self._known: dict[tuple[object, ...], int] = {}
        self.live = 0
        self.peak = 0

    def exclude(self, tensors: list[torch.Tensor]) -> None:
        """Count `tensors` (e.g. a weight version's) as parameters, not activations."""
        self._params |= {t.untyped_storage().data_ptr() for t in tensors}

    def add(self, nbytes: int) -> None:
        self.live += nbytes
        self.peak = max(self.peak, self.live)

    def release(self, nbytes: int) -> None:
        self.live -= nbytes

    @contextlib.contextmanager
    def saved(self, inputs: torch.Tensor, hooked: bool = False,
              owner: nn.Module | None = None) -> Iterator[list[int]]:
        """The bytes autograd saves inside the block (yields a 1-element total, filled in
        on exit); measured once per input shape, see the class docstring. `hooked=True`
        always runs the block under the (identity) hooks."""
        key = (id(owner), tuple(inputs.shape), inputs.dtype, self.module.training,
               torch.is_grad_enabled())
        known = self._known.get(key)
        if known is not None and not hooked:
            yield [known]
            return
        total = [0]
        with self._counting(inputs, total):
            yield total
        self._known[key] = total[0]

    @contextlib.contextmanager
    def _counting(self, inputs: torch.Tensor, total: list[int]) -> Iterator[None]:
        seen = {inputs.untyped_storage().data_ptr()} | self._params

        def pack(t: torch.Tensor) -> torch.Tensor:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                total[0] += t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
