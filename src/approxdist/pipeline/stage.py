"""One stage's compute on micro-batches: forward, backward, loss, optional recomputation (GPipe).

`StageCompute` keeps, per micro-batch in flight, what its backward needs: the input (a
leaf that collects the input gradient) and the output with its autograd graph, or with
`recompute=True` only the input (GPipe's re-materialisation, Huang et al. 2019 §2.3):
the forward then runs without a graph and backward runs it again first. The re-run
draws the same random numbers (dropout) and leaves batch-norm running statistics as
they were, so a recomputed step is identical to a stored one. The last stage turns its
output into `weight * loss_fn(output, labels)` (docs/pipeline.md, "Micro-batches").

With `fuse_accumulation` ("auto", the default: layers of 2^19 weights or more; "all";
"off") the stage's `nn.Linear` layers add each micro-batch's weight gradient into
`.grad` inside the GEMM instead of autograd's separate pass
(`accumulate.WeightGradFusion`, Megatron-LM's gradient-accumulation fusion).

Zero-bubble schedules split a backward in two (`split=True`): `backward_input` computes
the input gradient to send and keeps the graph, `backward_weight` later accumulates the
parameters' gradients (`split_backward`, Qi et al. ICLR 2024). A split stage's fused
layers defer: `I` keeps their `(x, g)` and `W` runs the GEMM into `.grad`
(`accumulate.DeferredWeightGrads`); `backward_weight(m, flush=False)` holds it back so that
the `W`s of several micro-batches run as one GEMM per layer at the next flush.

What is held for backward is counted by `stage_memory.ActivationMemory`; the replayed
random numbers and frozen batch-norm statistics of a recomputed forward are `recompute`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from approxdist.errors import ConfigError
from approxdist.optim.step_into import Rows
from approxdist.pipeline.accumulate import MODES as FUSION_MODES
from approxdist.pipeline.accumulate import DeferredWeightGrads, WeightGradFusion
from approxdist.pipeline.recompute import RngState, frozen_batchnorm_stats, replayed_rng, rng_state
from approxdist.pipeline.split_backward import WeightGrad, full_backward, input_grad
from approxdist.pipeline.stage_memory import ActivationMemory

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@runtime_checkable
class Criterion(Protocol):
    """A loss function that also counts its correct predictions (e.g. `train.task.Task`);
    a plain loss function is scored by `hits`."""

    def __call__(self, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor: ...

    def hits(self, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor: ...

@dataclass
class _InFlight:
    """What micro-batch m keeps between its forward and its backward."""

    inputs: torch.Tensor
    labels: torch.Tensor | None
    weight: float
    output: torch.Tensor | None  # with graph (stored mode); None once sent (recompute)
    loss: torch.Tensor | None
    rng: RngState | None
    nbytes: int


class StageCompute:
    """Forward/backward of one stage's module on micro-batches, keyed by micro-batch index."""

    def __init__(self, module: nn.Module, *, is_first: bool, is_last: bool, loss_fn: LossFn,
                 recompute: bool = False, fuse_accumulation: str = "auto",
                 call: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 split: bool = False, memory: ActivationMemory | None = None) -> None:
        self.module, self.is_first, self.is_last = module, is_first, is_last
        self.split = split
        #: runs the stage forward (the module itself, or a weight version of it: `weights`)
        self.call: Callable[[torch.Tensor], torch.Tensor] = call if call is not None else module
        self.loss_fn, self.recompute = loss_fn, recompute
        self.count_hits = loss_fn.hits if isinstance(loss_fn, Criterion) else hits
        if fuse_accumulation not in FUSION_MODES:
            raise ConfigError(f"fuse_accumulation = {fuse_accumulation!r} is not one of: "
                              f"{', '.join(FUSION_MODES)}")
        smallest = FUSION_MODES[fuse_accumulation]
        self.fusion = WeightGradFusion(module, smallest) if smallest is not None else None
        #: a split stage's fused layers keep their weight gradients here until `W`
        self.deferred = DeferredWeightGrads() if split and self.fusion is not None else None
        #: shared by the stages (chunks) of one rank, whose peak is the rank's
        self.memory = memory if memory is not None else ActivationMemory(module)
        if memory is not None:
            memory.exclude(list(module.parameters()))
        self._live: dict[int, _InFlight] = {}
        #: micro-batch -> its weight gradient still to compute (after `backward_input`) and
        #: the activation bytes that stay alive until then
        self._weights: dict[int, tuple[WeightGrad, int]] = {}
        #: micro-batches whose `W` ran but whose deferred GEMMs wait for `flush_weights`
        self._unflushed: dict[int, int] = {}
        #: micro-batch -> bytes of the rows its `backward` kept (`defer_weights`)
        self._rows_bytes: dict[int, int] = {}
        self.loss_sum = torch.zeros((), dtype=torch.float64)
        self.correct = torch.zeros((), dtype=torch.int64)
        #: evaluation only: the true class's probability summed (a loss with `soft_sum`)
        self.soft_sum = torch.zeros((), dtype=torch.float64)
        self._soft = getattr(loss_fn, "soft_sum", None)

    def reset_step(self) -> None:
        """Forget the previous step's loss, accuracy and probability sums and the memory
        peak."""
        self.loss_sum = torch.zeros((), dtype=torch.float64)
        self.correct = torch.zeros((), dtype=torch.int64)
        self.soft_sum = torch.zeros((), dtype=torch.float64)
        self.memory.peak = self.memory.live

    # -- training ---------------------------------------------------------------------
    def forward(self, m: int, x: torch.Tensor, labels: torch.Tensor | None,
                weight: float) -> None:
        """Run micro-batch m forward and keep what its backward needs."""
        if not self.is_first:
            x.requires_grad_(True)
        rng = rng_state(x.device) if self.recompute else None
        nbytes = x.nelement() * x.element_size()
        if self.recompute:
            with torch.no_grad():
                out, loss = self._run(x, labels, weight)
        else:
            with self.memory.saved(x, owner=self.module) as saved, self._fused(m):
                out, loss = self._run(x, labels, weight)
            nbytes += saved[0]
        self.memory.add(nbytes)
        self._live[m] = _InFlight(x, labels, weight, out, loss, rng, nbytes)

    def _run(self, x: torch.Tensor, labels: torch.Tensor | None,
             weight: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = self.call(x)
        if not self.is_last:
            return out, None
        assert labels is not None, "the last stage needs the labels of every micro-batch"
        loss = self.loss_fn(out, labels) * weight
        self.loss_sum += loss.detach().double()
        self.correct += self.count_hits(out.detach(), labels)
        return out, loss

    def output(self, m: int) -> torch.Tensor:
        """Micro-batch m's output to send on; with recompute it is not kept afterwards."""
        item = self._live[m]
        assert item.output is not None, f"output of micro-batch {m} already sent"
        out = item.output.detach()
        if self.recompute:
            item.output = None
        return out

    def backward(self, m: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        """Back-propagate micro-batch m (`grad` of its output; None on the last stage).

        Returns the gradient of the stage input to send back (None on the first stage).
        Parameter gradients accumulate in `.grad`.
        """
        item, root, nbytes = self._take(m)
        torch.autograd.backward(root, grad)
        self.memory.release(nbytes)
        if self.deferred is not None and not self.split:  # rows kept for the step
            self._rows_bytes[m] = self.deferred.nbytes(m)
            self.memory.add(self._rows_bytes[m])
        return None if self.is_first else item.inputs.grad

    def backward_input(self, m: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        """I: micro-batch m's input gradient only (None on the first stage, whose inputs are
        data); the graph and the activations stay until `backward_weight(m)`."""
        item, root, nbytes = self._take(m)
        if self.is_first:
            dx, later = None, full_backward(root, grad)
        else:
            dx, later = input_grad(root, grad, item.inputs, self.module.parameters())
        self._weights[m] = (later, nbytes)
        return dx

    def backward_weight(self, m: int, flush: bool = True) -> None:
        """W: accumulate micro-batch m's parameter gradients in `.grad` and free what its
        backward kept; `flush=False` leaves the fused layers' GEMMs to the next flush (a `W`
        of another micro-batch follows)."""
        later, nbytes = self._weights.pop(m)
        later.run()
        self._unflushed[m] = nbytes
        if flush:
            self.flush_weights()

    def flush_weights(self) -> None:
        """Run the deferred weight-gradient GEMMs of every `W` so far, one per layer."""
        if self.deferred is not None:
            self.deferred.flush(self._unflushed)
        self.memory.release(sum(self._unflushed.values()))
        self._unflushed = {}

    def defer_weights(self, on: bool) -> None:
        """With `on`, `backward` leaves the fused layers' weight gradients as rows (counted
        as held activations) until `take_rows` (an asynchronous stream's step: `stream_state`)."""
        if not self.split and self.fusion is not None:
            self.deferred = DeferredWeightGrads() if on else None
            self._rows_bytes = {}

    def take_rows(self, keys: Sequence[int]) -> list[tuple[nn.Linear, list[Rows]]]:
        """The rows `backward` kept for micro-batches `keys` (`defer_weights`), per layer."""
        if self.split or self.deferred is None:
            return []
        self.memory.release(sum(self._rows_bytes.pop(m, 0) for m in keys))
        return list(self.deferred.take(keys))

    def _take(self, m: int) -> tuple[_InFlight, torch.Tensor, int]:
        """Micro-batch m's kept state, the tensor its backward starts from (recomputed
        first with `recompute`) and the bytes it holds."""
        item = self._live.pop(m)
        extra = self._recompute(m, item) if self.recompute else 0
        root = item.loss if self.is_last else item.output
        assert root is not None
        return item, root, item.nbytes + extra

    def _recompute(self, m: int, item: _InFlight) -> int:
        """Re-run the forward with a graph, same random numbers, batch-norm stats untouched.

        It runs under the saved-tensor hooks (`hooked=True`): `frozen_batchnorm_stats`
        restores the running statistics in place afterwards, and autograd would otherwise
        refuse those buffers in backward as modified (training-mode batch-norm backward
        saves them but reads only the batch statistics).
        """
        assert item.rng is not None
        with replayed_rng(item.rng, item.inputs.device), frozen_batchnorm_stats(self.module), \
                self.memory.saved(item.inputs, hooked=True, owner=self.module) as saved, self._fused(m):
            out = self.call(item.inputs)
        item.output = out
        if self.is_last:
            assert item.labels is not None
            item.loss = self.loss_fn(out, item.labels) * item.weight
        self.memory.add(saved[0])
        return saved[0]

    def _fused(self, m: int) -> contextlib.AbstractContextManager[None]:
        if self.fusion is None:
            return contextlib.nullcontext()
        return self.fusion.active(self.deferred, m, every=not self.split)

    def close(self) -> None:
        """Give the module's layers back their own forward (see `fuse_accumulation`)."""
        if self.fusion is not None:
            self.fusion.remove()
            self.fusion = None

    @property
    def in_flight(self) -> int:
        """Micro-batches whose forward ran and whose backward (or W) did not."""
        return len(self._live) + len(self._weights) + len(self._unflushed)

    # -- evaluation ---------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        """Forward only; on the last stage add the summed loss and the correct count."""
        out = self.module(x)
        if self.is_last:
            assert labels is not None
            self.loss_sum += self.loss_fn(out, labels).double() * labels.shape[0]
            self.correct += self.count_hits(out, labels)
            if self._soft is not None:
                self.soft_sum += self._soft(out, labels)
        return out


def hits(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Correct class predictions (`out.argmax(1) == labels`) when `labels` are class indices
    of `out`'s shape without its class dimension; 0 for any other target (a user's loss on
    regression targets, say)."""
    if labels.dtype.is_floating_point or out.dim() < 2 or \
            tuple(labels.shape) != (out.shape[0], *out.shape[2:]):
        return torch.zeros((), dtype=torch.int64)
    return (out.argmax(1) == labels).sum()


@torch.no_grad()
def output_shape(module: nn.Module, sample_shape: tuple[int, ...], device: torch.device,
                 dtype: torch.dtype = torch.float32) -> tuple[int, ...]:
    """Per-sample output shape of `module` for per-sample input `sample_shape` of `dtype`
    (eval mode, 2 samples of zeros; token ids are int64)."""
    was_training = module.training
    module.eval()
    try:
        out = module(torch.zeros((2, *sample_shape), device=device, dtype=dtype))
    finally:
        module.train(was_training)
    return tuple(out.shape[1:])
