"""Micro-batch splitting and loss weights, checked against the full-batch oracle."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from approxdist.pipeline.errors import PipelineError
from approxdist.pipeline.microbatch import (
    loss_weights,
    microbatch_sizes,
    split_batch,
    split_microbatches,
)


@pytest.mark.parametrize("n", range(1, 13))
def test_sizes_match_tensor_split_and_differ_by_at_most_one(n: int) -> None:
    for m in range(1, n + 1):
        sizes = microbatch_sizes(n, m)
        assert sizes == [len(c) for c in torch.tensor_split(torch.arange(n), m)]
        assert sum(sizes) == n and max(sizes) - min(sizes) <= 1


def test_uneven_example() -> None:
    assert microbatch_sizes(10, 4) == [3, 3, 2, 2]
    assert loss_weights([3, 3, 2, 2]) == [0.3, 0.3, 0.2, 0.2]


def test_errors_name_both_values() -> None:
    with pytest.raises(PipelineError, match=r"micro-batches \(8\) exceed the batch size \(5\); "
                                            r"use 1\.\.5 micro-batches"):
        microbatch_sizes(5, 8)
    with pytest.raises(PipelineError, match=r"micro-batches \(0\) must be an integer >= 1"):
        split_batch(torch.zeros(4, 2), 0)
    with pytest.raises(PipelineError, match=r"labels have 3 samples but inputs have 4"):
        split_microbatches(torch.zeros(4, 2), torch.zeros(3), 2)
    with pytest.raises(PipelineError, match=r"shapes \(4, 2\), \(3, 2\)"):
        split_batch((torch.zeros(4, 2), torch.zeros(3, 2)), 2)
    with pytest.raises(PipelineError, match="got list"):
        split_batch([torch.zeros(4)], 2)


def test_split_tuple_inputs_and_labels() -> None:
    x = (torch.arange(10.0).reshape(5, 2), torch.arange(5))
    y = torch.arange(5) * 10
    mbs = split_microbatches(x, y, 2)
    assert [mb.size for mb in mbs] == [3, 2]
    assert [mb.index for mb in mbs] == [0, 1]
    first = mbs[0].inputs
    assert isinstance(first, tuple)
    assert torch.equal(first[1], torch.tensor([0, 1, 2]))
    assert mbs[1].labels is not None and torch.equal(mbs[1].labels, torch.tensor([30, 40]))
    assert split_microbatches(torch.zeros(3, 1), None, 3)[2].labels is None


@pytest.mark.parametrize("n, m", [(10, 4), (7, 3), (8, 8), (9, 1)])
def test_weighted_microbatch_losses_equal_full_batch_loss_and_gradients(n: int, m: int) -> None:
    torch.manual_seed(n * 10 + m)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    x, y = torch.randn(n, 5), torch.randint(0, 3, (n,))
    loss_fn = nn.CrossEntropyLoss()

    full = loss_fn(model(x), y)
    full.backward()
    oracle = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad()

    total = torch.zeros(())
    for mb in split_microbatches(x, y, m):
        assert isinstance(mb.inputs, torch.Tensor) and mb.labels is not None
        loss = loss_fn(model(mb.inputs), mb.labels) * mb.weight
        loss.backward()  # gradients accumulate across micro-batches
        total = total + loss.detach()
    torch.testing.assert_close(total, full.detach())
    for p, g in zip(model.parameters(), oracle):
        torch.testing.assert_close(p.grad, g)
