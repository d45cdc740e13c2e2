"""A stage's weight versions for asynchronous schedules (PipeDream weight stashing, 2BW).

The module's own parameters are the newest weights, W(t), the ones the optimiser steps.
Every version a forward or backward uses is its own set of leaf tensors, so a step never
touches the weights a stashed micro-batch's backward needs. A forward runs the module with
a version's tensors through `torch.func.functional_call` (buffers such as batch-norm
statistics stay the module's); its backward accumulates into that version's `.grad`. An
update (`Update`, as data in the schedule) hands the gradient of the version it was
computed at to the module's parameters and steps the optimiser:

    PipeDream:  W(t+1) = W(t) - lr * grad f(W(t - d))   (d = stage's delay, 0 on the last)
    2BW:        W(t+1) = W(t) - lr * grad f(W(t - 1))

Versions live in *slots*, storage for one copy of the stage's weights that is reused once
the version in it is dropped (after the last action that uses it), so a stream allocates
its weights' storage once, not at every step. With a plain SGD (`optim.step_into`) the
step itself writes W(t+1) into a free slot and points the module's parameters there: the
slot of W(t) keeps W(t) for the micro-batches stashed on it, and nothing is copied; the
newest version is the module's own storage (version 0 too, when a stream starts). With any
other optimiser the step runs in place and a version later actions use is copied into a
slot (`copies` / `copied_bytes` count them). When no version holds the module's weights
any more (PipeDream's last stage, whose gradient has no delay), the step writes them in
place. A step's gradient (`StepGradient`) may keep a fused layer's weight gradient as its
micro-batches' rows `(x, g)` (`accumulate.DeferredWeightGrads`), so that SGD's GEMMs write
the step themselves (`optim.step_into`). A stage holds what the schedule's
`version_limit` allows on top of the module's own weights; `peak_bytes` reports that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from approxdist.optim.step_into import Rows, rows_product, step_into, steps_into
from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.schedule.versions import Update

Version = dict[str, torch.Tensor]
#: storage for one copy of a stage's parameters, in parameter order
Slot = list[torch.Tensor]


@dataclass
class StepGradient:
    """One step's gradient per parameter (module order): a tensor or None, and, for a fused
    layer's weight whose gradient was deferred, its rows (parameter index -> `[(x, g), ...]`
    over the step's micro-batches, the gradient being the sum of their `g^T x`)."""

    grads: list[torch.Tensor | None]
    rows: dict[int, list[Rows]]

    def scale(self, factor: float) -> None:
        """Multiply the gradient by `factor` (the rows through their `g`)."""
        self.grads = [g.mul_(factor) if g is not None else None for g in self.grads]
        self.rows = {i: [(x, g * factor) for x, g in pairs] for i, pairs in self.rows.items()}

    def dense(self) -> list[torch.Tensor | None]:
        """Every gradient as a tensor (the rows' GEMMs run)."""
        return [rows_product(self.rows[i]) if i in self.rows else g
                for i, g in enumerate(self.grads)]


def available_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors on `device`: the GPU's free memory, or the host's
    `MemAvailable` (Linux); None where it cannot be read."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_version_memory(module: nn.Module, versions: int, stage: int, schedule: str,
                         free: int | None) -> int:
    """The bytes `versions` copies of `module`'s parameters take; `PipelineError` when they
    do not fit in `free` bytes (None: not checked)."""
    need = versions * sum(p.nelement() * p.element_size() for p in module.parameters())
    if free is not None and need > free:
        raise PipelineError(
            f"{schedule} keeps up to {versions} weight version(s) on stage {stage}: "
            f"{need / 2**20:.1f} MiB, but only {free / 2**20:.1f} MiB are free; use 2bw (two "
            f"versions per stage), more stages (fewer parameters each) or a flushed schedule")
    return need


class WeightVersions:
    """Versions of `module`'s parameters, by version number, in reused slots; `current`
    selects the one `__call__` runs with."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.names = [n for n, p in module.named_parameters()]
        self._params = [p for _, p in module.named_parameters()]
        self._nbytes = sum(p.nelement() * p.element_size() for p in self._params)
        self.versions: dict[int, Version] = {}
        self._slot_of: dict[int, Slot] = {}  # version -> the slot holding it
        self._free: list[Slot] = []
        #: the slot the module's parameters point at (`step_into`); None: their own storage
        self._module_slot: Slot | None = None
        self.out_of_place = False
        self.current = 0
        self.live_bytes = 0
        self.peak_bytes = 0
        self.copies = 0  # versions copied from the module's weights (in-place optimisers)
        self.copied_bytes = 0
        self.row_steps = 0  # steps given a fused layer's weight gradient as rows
        self.in_place_steps = 0  # out-of-place steps that wrote the module's weights in place
        #: micro-batches whose backward added into each version's `.grad` since its last update
        self.accumulated: dict[int, list[int]] = {}

    def begin(self, optimizer: torch.optim.Optimizer, keep_initial: bool = True) -> None:
        """A stream begins, stepped by `optimizer`; with `keep_initial`, the module's weights
        are version 0 for its first actions."""
        self.end()
        self.out_of_place = steps_into(optimizer)
        if self.out_of_place:  # no copy: steps write elsewhere
            self._module_slot = [p.data for p in self._params]
            if keep_initial:
                self._hold(0, self._module_slot)
        elif keep_initial:
            self._copy_module(0)

    def end(self) -> None:
        """The stream drained: every version and slot dropped (the module keeps its weights)."""
        self.versions.clear()
        self._slot_of.clear()
        self.accumulated.clear()
        self._free.clear()
        self._module_slot = None
        self.current = 0
        self._account()

    def _slot(self) -> Slot:
        if self._free:
            return self._free.pop()
        return [torch.empty_like(p, memory_format=torch.preserve_format) for p in self._params]

    def _hold(self, v: int, slot: Slot) -> None:
        """Version `v` is `slot`'s values, seen through fresh leaf tensors (no graph yet)."""
        self._slot_of[v] = slot
        self.versions[v] = {n: t.detach().requires_grad_(p.requires_grad)
                            for n, t, p in zip(self.names, slot, self._params)}
        self._account()

    def _copy_module(self, v: int) -> None:
        slot = self._slot()
        with torch.no_grad():
            for t, p in zip(slot, self._params):
                t.copy_(p)
        self.copies += 1
        self.copied_bytes += self._nbytes
        self._hold(v, slot)

    def _account(self, *writing: Slot) -> None:
        """Bytes of the slots held (and being `writing`) beyond the module's own weights,
        and their peak."""
        held = {id(s): s for s in (*self._slot_of.values(), *writing)}
        held.pop(id(self._module_slot), None)
        self.live_bytes = len(held) * self._nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _release(self, slot: Slot | None) -> None:
        """Give `slot` back for reuse unless a version or the module still holds it."""
        if slot is None or slot is self._module_slot or \
                any(s is slot for s in self._slot_of.values()):
            return
        self._free.append(slot)

    def tensors(self, v: int) -> list[torch.Tensor]:
        """The leaf tensors of version `v` (their data pointers: not activations)."""
        return list(self.versions[v].values())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The module's forward with version `current`'s weights."""
        if self.current not in self.versions:
            raise PipelineError(f"weight version {self.current} is not kept on this stage "
                                f"(kept: {sorted(self.versions)}); the schedule used a "
                                f"version after its last planned use")
        return functional_call(self.module, self.versions[self.current], (x,))

    def backward_done(self, microbatch: int) -> None:
        """Micro-batch `microbatch`'s backward added its gradient into version `current`."""
        self.accumulated.setdefault(self.current, []).append(microbatch)

    def take_gradient(self, step: Update,
                      rows: Sequence[tuple[nn.Linear, list[Rows]]] = ()) -> StepGradient:
        """The gradient `step` applies: what its micro-batches' backwards added into version
        `step.computed_at` (taken out of it, so the version can be dropped), and the `rows`
        of its fused layers (`StageCompute.take_rows`)."""
        got = self.accumulated.pop(step.computed_at, [])
        if tuple(got) != step.items:
            raise PipelineError(f"update {step} on stage {step.stage} expected the gradients of "
                                f"micro-batches {list(step.items)} at version {step.computed_at}, "
                                f"has {got}")
        grads = []
        for leaf in self.versions[step.computed_at].values():
            grads.append(leaf.grad)
            leaf.grad = None
        kept: dict[int, list[Rows]] = {}
        index = {id(p): i for i, p in enumerate(self._params)}
        for layer, pairs in rows:
            kept[index[id(layer.weight)]] = pairs
            if layer.bias is not None:
                i = index[id(layer.bias)]
                for _, g in pairs:
                    had = grads[i]
                    grads[i] = g.sum(0) if had is None else had + g.sum(0)
        return StepGradient(grads, kept)

    def load_gradient(self, grads: list[torch.Tensor | None]) -> None:
        """Put `grads` (from `take_gradient`) into the module's `.grad`, where a replicated
        stage's all-reduce sums them (`module_gradient` reads the result back)."""
        for p, g in zip(self._params, grads):
            p.grad = g

    def module_gradient(self) -> list[torch.Tensor | None]:
        return [p.grad for p in self._params]

    def update(self, step: Update, grad: StepGradient, optimizer: torch.optim.Optimizer,
               keep: bool) -> None:
        """Apply `step` with `grad` (from `take_gradient`) to the module's (newest) weights;
        `keep` holds the result as version `step.version` for later actions."""
        dense = grad.grads if self.out_of_place else grad.dense()
        for p, g in zip(self._params, dense):
            p.grad = g
        if self.out_of_place:
            before = self._module_slot
            held = any(s is before for s in self._slot_of.values())
            slot = self._slot() if held or before is None else before  # else: in place
            self.in_place_steps += slot is before
            self.row_steps += bool(grad.rows)
            self._account(slot)  # both are alive while the step writes
            step_into(optimizer, self._params, slot,  # type: ignore[arg-type]
                      {id(self._params[i]): r for i, r in grad.rows.items()})
            self._module_slot = slot
            self._release(before)
            if keep:
                self._hold(step.version, slot)
        else:
            optimizer.step()
            if keep:
                self._copy_module(step.version)
        optimizer.zero_grad(set_to_none=True)
        self._account()

    def drop(self, v: int) -> None:
        """Forget version `v` (no later action uses it): its slot is free for the next."""
        self.versions.pop(v, None)
        slot = self._slot_of.pop(v, None)
        self._release(slot)
        self._account()
