"""PowerSGD against torch's `powerSGD_hook`, re-done in one process for N workers.

The hook needs a process group and a DDP bucket; `hook_steps` below re-implements its
steps for a bucket holding one matrix, line by line from
torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py (torch 2.x, `powerSGD_hook`),
calling the hook module's own `_orthogonalize` (Gram-Schmidt up to rank 2, QR above), and
with every `dist.all_reduce` replaced by the sum over the simulated workers. Our Gram-Schmidt
and torch's QR may differ in the signs of columns and in float rounding; P Q^T does not
depend on the signs, so the results agree within float tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as hook

from approxdist.comm.compressors import Where, get_compressor
from approxdist.comm.compressors.powersgd import orthogonalise
from tests.helpers.lockstep import lockstep

WORKERS = 3
STEPS = 4


def hook_steps(grads: list[list[torch.Tensor]], rank: int, seed: int) -> list[torch.Tensor]:
    """What every worker's bucket holds after each step (the hook's return value)."""
    shape = grads[0][0].shape
    n = shape[0]
    m = grads[0][0].numel() // n
    r = min(n, m, rank)
    errors: list[torch.Tensor | None] = [None] * WORKERS    # state.error_dict (l.423-433)
    rng = np.random.RandomState(seed)                        # PowerSGDState.rng
    q_memory: torch.Tensor | None = None                     # state.q_memory_dict
    out = []
    for step_grads in grads:
        inputs, copies = [], []
        for w, g in enumerate(step_grads):
            x = g.reshape(-1).clone()
            if errors[w] is not None:
                x.add_(errors[w])                            # l.425
            copies.append(x.detach().clone())                # l.438
            inputs.append(x)
        matrices = [x.view(1, n, m) for x in inputs]         # l.449, l.510
        if q_memory is None:                                 # l.546-561: first step
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(rng.randint(1_000_000_000))
                q = torch.randn(1, m, r)
        else:
            q = q_memory.clone()                             # warm start
        hook._orthogonalize(q, 0)                            # l.544 / l.561 (same Q everywhere)
        ps = [torch.bmm(mat, q) for mat in matrices]         # l.565
        p_sum = sum(ps[1:], ps[0].clone())                   # l.585: all-reduce P
        hook._orthogonalize(p_sum, 0)                        # l.595
        q_locals = [torch.bmm(mat.transpose(1, 2), p_sum) for mat in matrices]  # l.599
        q_sum = sum(q_locals[1:], q_locals[0].clone()).div_(WORKERS)  # l.607, l.615
        q_memory = q_sum
        approx = torch.bmm(p_sum, q_sum.transpose(1, 2))     # l.618
        for w in range(WORKERS):
            errors[w] = copies[w] - approx.view(-1)          # l.637
        out.append(approx.view(shape))
    return out


@pytest.mark.parametrize(("rank", "shape"), [(1, (32, 48)), (2, (32, 48)), (4, (64, 40)),
                                             (2, (8, 3, 3, 3)), (8, (4, 6))])
def test_powersgd_equals_the_hook(rank: int, shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(7)
    grads = [[torch.randn(shape, generator=gen) for _ in range(WORKERS)] for _ in range(STEPS)]
    comps = [get_compressor(f"powersgd:{rank}", Where(shape, seed=11, worker=w))
             for w in range(WORKERS)]
    expected = hook_steps(grads, rank, seed=Where(shape, seed=11).shared_seed)  # our rule
    for step, (g, ref) in enumerate(zip(grads, expected, strict=True)):
        for w, got in enumerate(lockstep(comps, g)):
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5,
                                       msg=lambda s, step=step, w=w: f"step {step} worker {w}: {s}")


def test_gram_schmidt_equals_the_hooks() -> None:
    m = torch.randn(50, 4, generator=torch.Generator().manual_seed(3))
    ours = m.clone()
    orthogonalise(ours)
    theirs = m.clone().unsqueeze(0)
    hook._orthogonalize_gram_schmidt(theirs, 0)
    torch.testing.assert_close(ours, theirs[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.t() @ ours, torch.eye(4), rtol=0, atol=1e-5)


def test_a_zero_gradient_gives_zero_not_nan() -> None:
    comp = get_compressor("powersgd:2", Where((6, 5)))
    out = lockstep([comp], [torch.zeros(6, 5)])[0]
    assert torch.equal(out, torch.zeros(6, 5))
