"""Split a mini-batch into M micro-batches and weight their losses (GPipe; seed 000).

Sizes follow `torch.tensor_split`: with batch size N, the first N mod M micro-batches
hold ceil(N/M) samples and the rest floor(N/M), so sizes differ by at most one
(N=10, M=4 -> 3, 3, 2, 2). Micro-batch m with n_m samples gets the loss weight
w_m = n_m / N: for a mean-reduced loss L_m on micro-batch m, sum_m w_m * L_m equals the
mean loss over the whole mini-batch, and so do the accumulated gradients (up to
float rounding; batch-norm layers see per-micro-batch statistics, see docs/pipeline.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from approxdist.pipeline.errors import PipelineError

#: a tensor, or a tuple of tensors sharing the batch dimension 0
Batch = torch.Tensor | tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class MicroBatch:
    """Micro-batch `index`: its inputs and labels, `size` samples, loss weight `weight`."""

    index: int
    inputs: Batch
    labels: torch.Tensor | None
    size: int
    weight: float


def microbatch_sizes(batch_size: int, num_microbatches: int) -> list[int]:
    """Sizes as `torch.tensor_split` makes them: the first N mod M get one sample more."""
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) \
            or num_microbatches < 1:
        raise PipelineError(f"micro-batches ({num_microbatches!r}) must be an integer >= 1")
    if num_microbatches > batch_size:
        raise PipelineError(
            f"micro-batches ({num_microbatches}) exceed the batch size ({batch_size}); use "
            f"1..{batch_size} micro-batches or a larger batch")
    base, extra = divmod(batch_size, num_microbatches)
    return [base + 1 if m < extra else base for m in range(num_microbatches)]


def loss_weights(sizes: list[int]) -> list[float]:
    """w_m = n_m / N: scale micro-batch m's mean loss by w_m before its backward."""
    total = sum(sizes)
    return [n / total for n in sizes]


def batch_size_of(batch: Batch) -> int:
    """Size of dimension 0, checked to agree across the tensors of a tuple."""
    tensors = _as_tuple(batch)
    sizes = {int(t.shape[0]) for t in tensors if t.dim() > 0}
    if len(sizes) != 1 or any(t.dim() == 0 for t in tensors):
        shapes = ", ".join(str(tuple(t.shape)) for t in tensors)
        raise PipelineError(f"batch tensors must share a non-empty dimension 0; got shapes "
                            f"{shapes}")
    return sizes.pop()


def split_batch(batch: Batch, num_microbatches: int) -> list[Batch]:
    """Split a tensor (or each tensor of a tuple) along dimension 0 into M pieces (views)."""
    sizes = microbatch_sizes(batch_size_of(batch), num_microbatches)
    if isinstance(batch, torch.Tensor):
        return list(torch.split(batch, sizes))
    pieces = [torch.split(t, sizes) for t in batch]
    return [tuple(p[m] for p in pieces) for m in range(num_microbatches)]


def split_microbatches(inputs: Batch, labels: torch.Tensor | None,
                       num_microbatches: int) -> list[MicroBatch]:
    """Inputs and labels split alike, each micro-batch with its size and loss weight."""
    n = batch_size_of(inputs)
    if labels is not None and batch_size_of(labels) != n:
        raise PipelineError(f"labels have {batch_size_of(labels)} samples but inputs have "
                            f"{n}; give one label per sample")
    sizes = microbatch_sizes(n, num_microbatches)
    xs = split_batch(inputs, num_microbatches)
    ys: list[torch.Tensor | None] = (
        list(torch.split(labels, sizes)) if labels is not None else [None] * len(xs))
    return [MicroBatch(m, x, y, size, w)
            for m, (x, y, size, w) in enumerate(zip(xs, ys, sizes, loss_weights(sizes)))]


def _as_tuple(batch: Batch) -> tuple[torch.Tensor, ...]:
    if isinstance(batch, torch.Tensor):
        return (batch,)
    if isinstance(batch, tuple) and batch and all(isinstance(t, torch.Tensor) for t in batch):
        return batch
    raise PipelineError(f"a batch must be a tensor or a non-empty tuple of tensors, got "
                        f"{type(batch).__name__}; wrap other inputs in a tuple of tensors")
