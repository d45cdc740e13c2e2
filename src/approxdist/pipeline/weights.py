"""A stage's weight versions for asynchronous schedules (PipeDream weight stashing, 2BW).

The module's own parameters are the newest weights, W(t); the optimiser updates them in
place. Every version a forward or backward uses is a separate set of leaf tensors
(`snapshot`), copied from the module's parameters when the update that makes it
happens, so an in-place update never touches the weights a stashed micro-batch's
backward needs. A forward runs the module with a version's tensors through
`torch.func.functional_call` (buffers such as batch-norm statistics stay the module's);
its backward accumulates into that version's `.grad`. An update (`Update`, as data in
the schedule) hands the gradient of the version it was computed at to the module's
parameters, steps the optimiser, and snapshots the result if a later action uses it:

    PipeDream:  W(t+1) = W(t) - lr * grad f(W(t - d))   (d = stage's delay, 0 on the last)
    2BW:        W(t+1) = W(t) - lr * grad f(W(t - 1))

A version is dropped after the last action that uses it, so a stage holds what the
schedule's `version_limit` allows (plus the module's own parameters); `peak_bytes`
reports the versions' memory.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.schedule.versions import Update

Version = dict[str, torch.Tensor]


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
    """Versions of `module`'s parameters, by version number; `current` selects the one
    `__call__` runs with."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.names = [n for n, p in module.named_parameters()]
        self._params = [p for _, p in module.named_parameters()]
        self.versions: dict[int, Version] = {}
        self.current = 0
        self.live_bytes = 0
        self.peak_bytes = 0
        #: micro-batches whose backward added into each version's `.grad` since its last update
        self.accumulated: dict[int, list[int]] = {}

    def reset(self, keep_initial: bool = True) -> None:
        """Drop every version; with `keep_initial`, the module's weights become version 0 (a
        stream begins), without, nothing is kept (a stream drained)."""
        self.versions.clear()
        self.accumulated.clear()
        self.live_bytes, self.current = 0, 0
        if keep_initial:
            self._snapshot(0)

    def _snapshot(self, v: int) -> None:
        with torch.no_grad():
            self.versions[v] = {n: p.detach().clone().requires_grad_(p.requires_grad)
                                for n, p in zip(self.names, self._params)}
        self.live_bytes += sum(t.nelement() * t.element_size() for t in self.versions[v].values())
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

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

    def take_gradient(self, step: Update) -> list[torch.Tensor | None]:
        """The gradient `step` applies: what its micro-batches' backwards added into version
        `step.computed_at` (taken out of it, so the version can be dropped)."""
        got = self.accumulated.pop(step.computed_at, [])
        if tuple(got) != step.items:
            raise PipelineError(f"update {step} on stage {step.stage} expected the gradients of "
                                f"micro-batches {list(step.items)} at version {step.computed_at}, "
                                f"has {got}")
        grads = []
        for leaf in self.versions[step.computed_at].values():
            grads.append(leaf.grad)
            leaf.grad = None
        return grads

    def load_gradient(self, grads: list[torch.Tensor | None]) -> None:
        """Put `grads` (from `take_gradient`) into the module's `.grad`, where a replicated
        stage's all-reduce sums them (`module_gradient` reads the result back)."""
        for p, g in zip(self._params, grads):
            p.grad = g

    def module_gradient(self) -> list[torch.Tensor | None]:
        return [p.grad for p in self._params]

    def update(self, step: Update, grads: list[torch.Tensor | None],
               optimizer: torch.optim.Optimizer, keep: bool) -> None:
        """Apply `step` with `grads` (from `take_gradient`) to the module's (newest) weights;
        `keep` snapshots the result as version `step.version`."""
        for p, g in zip(self._params, grads):
            p.grad = g
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if keep:
            self._snapshot(step.version)

    def drop(self, v: int) -> None:
        """Forget version `v` (no later action uses it)."""
        gone = self.versions.pop(v, None)
        if gone is not None:
            self.live_bytes -= sum(t.nelement() * t.element_size() for t in gone.values())
