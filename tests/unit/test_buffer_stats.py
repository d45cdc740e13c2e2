"""`average_float_buffers`: batch-norm statistics averaged over replicas in one vector."""

from __future__ import annotations

import torch
from torch import nn

from approxdist.data_parallel.buffer_stats import average_float_buffers


def _replica(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.Linear(7, 3), nn.BatchNorm1d(3))
    for _ in range(seed + 1):  # a different number of batches per replica
        model(torch.randn(8, 5))
    return model


def test_every_float_buffer_takes_the_mean_over_replicas_and_counters_stay() -> None:
    replicas = [_replica(s) for s in range(3)]
    before = [{k: v.clone() for k, v in r.state_dict().items()} for r in replicas]
    flats = [torch.cat([b.reshape(-1) for b in r.buffers() if b.is_floating_point()])
             for r in replicas]
    for r in replicas:
        average_float_buffers(r, lambda flat: torch.stack(flats).mean(0))
    for r, old in zip(replicas, before):
        for key, value in r.state_dict().items():
            if key.endswith(("running_mean", "running_var")):
                assert torch.equal(value, torch.stack([b[key] for b in before]).mean(0)), key
            else:  # parameters and the integer num_batches_tracked are not buffers to average
                assert torch.equal(value, old[key]), key


def test_the_vector_has_the_asked_dtype_and_is_cast_back() -> None:
    model = _replica(0)
    seen: list[torch.dtype] = []

    def halve(flat: torch.Tensor) -> torch.Tensor:
        seen.append(flat.dtype)
        return flat / 2

    means = [m.running_mean.clone() for m in model if isinstance(m, nn.BatchNorm1d)]
    average_float_buffers(model, halve, torch.float64)
    assert seen == [torch.float64]
    bns = [m for m in model if isinstance(m, nn.BatchNorm1d)]
    assert all(bn.running_mean.dtype == torch.float32 for bn in bns)
    assert all(torch.equal(bn.running_mean, m / 2) for bn, m in zip(bns, means))


def test_a_model_without_float_buffers_calls_no_mean() -> None:
    calls: list[torch.Tensor] = []
    average_float_buffers(nn.Linear(3, 2), lambda flat: calls.append(flat) or flat)
    assert calls == []
