"""Autograd and forward hooks: overlap with backward, end of backward, early forward (seed 001).

* `BackwardHooks` puts a post-accumulate-grad hook on every reduced parameter. The first
  one of a backward pass calls `on_start` and queues `on_end` to run when the autograd
  engine has finished the pass (the same mechanism DDP's reducer uses), so after
  `loss.backward()` returns the gradients are averaged, in any user loop.
* `ForwardGate` (early forward, seed 001's "overtaking"): a forward pre-hook on each module
  that owns parameters waits only for the buckets holding *its* parameters, so the next
  forward of layer 1 starts as soon as layer 1 is updated while later layers are still
  on the wire. It assumes a parameter is read in the forward of the module that
  registers it (true for torch.nn layers).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from approxdist.data_parallel.reducer import BucketState
from approxdist.trace.phases import WAIT
from approxdist.trace.recorder import NULL_RECORDER, Recorder


def queue_end_of_backward(fn: Callable[[], None]) -> None:
    """Run `fn` once the current backward pass has finished (call from inside a hook)."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)  # noqa: SLF001 - as DDP


class BackwardHooks:
    """Gradient hooks feeding `on_grad(bucket, slot, param)`; `on_start`/`on_end` per pass."""

    def __init__(self, slots: Sequence[tuple[nn.Parameter, int, int]],
                 on_start: Callable[[], None], on_grad: Callable[[int, int, nn.Parameter], None],
                 on_end: Callable[[], None]) -> None:
        self.on_start, self.on_grad, self.on_end = on_start, on_grad, on_end
        self.enabled = True
        self.in_backward = False
        self._handles = [p.register_post_accumulate_grad_hook(self._hook(b, s))
                         for p, b, s in slots]

    def _hook(self, bucket: int, slot: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            if not self.enabled:
                return
            if not self.in_backward:
                self.in_backward = True
                self.on_start()
                queue_end_of_backward(self._end)
            self.on_grad(bucket, slot, param)  # type: ignore[arg-type]

        return hook

    def _end(self) -> None:
        self.in_backward = False
        self.on_end()

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Gradients accumulate locally inside the block (DDP's `no_sync`)."""
        before, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = before

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


class ForwardGate:
    """Forward pre-hooks that wait for the buckets of each module's own parameters."""

    def __init__(self, module: nn.Module, buckets: Sequence[BucketState],
                 rec: Recorder = NULL_RECORDER) -> None:
        where = {id(p): b for b in buckets for p in b.params}
        self.rec = rec
        self.wait_s = 0.0
        self._handles = []
        for mod in module.modules():
            mine = {id(where[id(p)]): where[id(p)] for p in mod.parameters(recurse=False)
                    if id(p) in where}
            if mine:
                self._handles.append(mod.register_forward_pre_hook(self._pre(list(mine.values()))))

    def _pre(self, buckets: list[BucketState]) -> Callable[..., None]:
        def pre(module: nn.Module, args: Any) -> None:
            for b in buckets:
                if not b.done.is_set():
                    t0 = time.perf_counter()
                    with self.rec.span(WAIT, bucket=b.plan.index):
                        b.done.wait()
                    self.wait_s += time.perf_counter() - t0
                b.wait()  # raises the bucket's error, if any

        return pre

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
