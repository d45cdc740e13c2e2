"""`pipeline.weights.WeightVersions` on PipeDream's first stage of two, in one process.

Micro-batch n's forward runs on version n - 1 (version 0 for the first two) and its
backward on the same version after version n was made (weight stashing), one step per
micro-batch. The replay keeps a clone of every version and steps a separate copy of the
module; the versions must compute the same outputs and weights, a plain SGD without a
single copy of the weights, any other optimiser with one per kept version, and the
storage comes from at most as many slots as versions are alive.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.func import functional_call

from approxdist.pipeline.schedule.versions import Update
from approxdist.pipeline.weights import WeightVersions

ITEMS = 6
Factory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
OPTIMIZERS: dict[str, Factory] = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
}


def _module() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def _x(n: int) -> torch.Tensor:
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(n))


def _replay(factory: Factory) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each forward's output and the weights after the last step, from a clone of every
    version (step n applies micro-batch n - 1's gradient at its forward's version)."""
    module = _module()
    opt = factory(list(module.parameters()))
    clones = {0: {n: p.detach().clone().requires_grad_() for n, p in module.named_parameters()}}
    outs = []
    for n in range(ITEMS):
        outs.append(functional_call(module, clones[max(n - 1, 0)], (_x(n),)).detach())
        if n == 0:
            continue
        at = clones[max(n - 2, 0)]
        out = functional_call(module, at, (_x(n - 1),))
        grads = torch.autograd.grad(out.square().sum(), list(at.values()))
        for p, g in zip(module.parameters(), grads):
            p.grad = g
        opt.step()
        opt.zero_grad(set_to_none=True)
        clones[n] = {k: p.detach().clone().requires_grad_() for k, p in module.named_parameters()}
    return outs, [p.detach() for p in module.parameters()]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_stashed_versions_match_a_replay_of_clones(name: str) -> None:
    module = _module()
    opt = OPTIMIZERS[name](list(module.parameters()))
    wv = WeightVersions(module)
    wv.begin(opt)
    storages: set[int] = set()
    outs, kept = [], {}
    for n in range(ITEMS):  # PipeDream, stage 0 of 2: F(n) on v(n-1), then B(n-1), U(n)
        wv.current = max(n - 1, 0)
        kept[n] = out = wv(_x(n))
        outs.append(out.detach())
        if n == 0:
            continue
        done = n - 1
        wv.current = max(done - 1, 0)
        kept.pop(done).square().sum().backward()
        wv.backward_done(done)
        step = Update(0, 0, done + 1, (done,), wv.current)
        grads = wv.take_gradient(step)
        if wv.current != n - 1:
            wv.drop(wv.current)  # its last backward ran
        wv.update(step, grads, opt, keep=True)
        storages |= {t.data_ptr() for v in wv.versions for t in wv.tensors(v)}
    want_outs, want = _replay(OPTIMIZERS[name])
    assert len(outs) == len(want_outs) == ITEMS
    for got, ref in zip(outs, want_outs):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    for p, ref in zip(module.parameters(), want, strict=True):
        torch.testing.assert_close(p.detach(), ref, rtol=0, atol=0)
    tensors = len(list(module.parameters()))
    assert wv.out_of_place == (name == "sgd")
    if wv.out_of_place:
        assert wv.copies == 0
        assert len(storages) <= 3 * tensors  # versions n - 1 and n, and the slot being written
    else:
        assert wv.copies == ITEMS  # version 0 and every step's
        assert len(storages) <= 2 * tensors  # the module's own weights are never a version
    assert wv.peak_bytes <= 2 * sum(p.nelement() * 4 for p in module.parameters())

