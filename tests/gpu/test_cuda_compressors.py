"""The order-free compressors on CUDA tensors give, step after step, bit for bit what they give
on CPU (its fused C kernels where built): 2 workers driven in lockstep over 3 steps, error
feedback and random streams carried, each worker's result and bytes compared.

Top-k (ties broken by index), random-k (indices from a CPU generator), TernGrad (max-norm
scale, a counter-based stream) and signSGD (majority vote) take no sum whose order a GPU
may change. QSGD's norm, sign + error feedback's mean magnitude and PowerSGD's products
are sums a GPU reduces in another order: a last-bit change can move one of QSGD's random
roundings or a sign, so neither bitwise equality nor a per-operation bound holds for them,
and they are not checked on CUDA here.

Skipped without a GPU; `scripts/gpu_check.sh` runs it (marker `gpu`)."""

from __future__ import annotations

import pytest
import torch

from approxdist.comm.compressors import Where, get_compressor
from tests.helpers.lockstep import lockstep

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")]

SPECS = ("topk:0.01", "randomk:0.01", "terngrad", "signsgd")
#: an odd shape, so that counts and packed codes end mid-byte
SHAPE = (37, 53)
WORKERS, STEPS = 2, 3
#: where the other run computes (a module constant, so the checks can be tried on CPU too)
DEVICE = "cuda"


def _grads(step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(50 + step)
    return [torch.randn(SHAPE, generator=gen) for _ in range(WORKERS)]


def _run(spec: str, device: torch.device) -> tuple[list[list[torch.Tensor]], list[list[int]]]:
    """Every step's per-worker results (on CPU) and message bytes of `spec` on `device`."""
    comps = [get_compressor(spec, Where(SHAPE, seed=3, worker=w, device=device))
             for w in range(WORKERS)]
    results, sent = [], []
    for step in range(STEPS):
        step_sent: list[int] = []
        out = lockstep(comps, [g.to(device) for g in _grads(step)], step_sent)
        assert all(r.device.type == device.type for r in out), spec
        results.append([r.cpu() for r in out])
        sent.append(step_sent)
    return results, sent


@pytest.mark.parametrize("spec", SPECS)
def test_order_free_compressors_on_cuda_equal_the_cpu_bit_for_bit(spec: str) -> None:
    cpu, cpu_sent = _run(spec, torch.device("cpu"))
    gpu, gpu_sent = _run(spec, torch.device(DEVICE))
    assert gpu_sent == cpu_sent
    for step, (want, got) in enumerate(zip(cpu, gpu)):
        for w, (a, b) in enumerate(zip(want, got)):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (spec, step, w)
    assert any(not torch.equal(cpu[0][0], g) for g in _grads(0)), spec  # it did compress
