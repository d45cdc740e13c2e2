"""`optim.step_into`: SGD's step written into other storage equals `torch.optim.SGD.step()` to the bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from approxdist.optim.step_into import step_into, steps_into

CONFIGS: list[dict[str, Any]] = [
    {"lr": 0.1},
    {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3},
    {"lr": 0.05, "momentum": 0.9, "nesterov": True},
    {"lr": 0.05, "momentum": 0.5, "dampening": 0.1, "weight_decay": 0.01},
]


def _params() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(5, 3, generator=gen).requires_grad_(),
            torch.randn(3, generator=gen).requires_grad_(),
            torch.randn(2, generator=gen).requires_grad_()]  # gets no gradient


@pytest.mark.parametrize("config", CONFIGS, ids=[str(c) for c in CONFIGS])
def test_equals_sgd_and_leaves_the_old_storage_untouched(config: dict[str, Any]) -> None:
    ref, ours = _params(), _params()
    frozen = ours[2]  # not held by the optimizer either: keeps its value
    ref_opt, opt = torch.optim.SGD(ref[:2], **config), torch.optim.SGD(ours[:2], **config)
    assert steps_into(opt)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=gen) for p in ref[:2]]
        for p, q, g in zip(ref, ours, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ref_opt.step()
        before = [p.data for p in ours]
        kept = [t.clone() for t in before]
        targets = [torch.empty_like(p) for p in ours]
        step_into(opt, ours, targets)
        for p, q in zip(ref, ours):
            assert torch.equal(p, q)
        for t, k in zip(before, kept):
            assert torch.equal(t, k), "the storage before the step keeps the old weights"
        for p, t in zip(ours, targets):
            assert p.data_ptr() == t.data_ptr(), "each parameter points at its target"
    assert torch.equal(frozen, ref[2])
    assert opt.state_dict()["state"].keys() == ref_opt.state_dict()["state"].keys()


def test_an_in_place_step_continues_from_its_momentum() -> None:
    ref, ours = _params()[:2], _params()[:2]
    ref_opt = torch.optim.SGD(ref, lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(ours, lr=0.1, momentum=0.9)
    for step in range(3):
        for p, q in zip(ref, ours):
            p.grad, q.grad = torch.full_like(p, step + 1.0), torch.full_like(q, step + 1.0)
        ref_opt.step()
        if step == 1:
            opt.step()
        else:
            step_into(opt, ours, [torch.empty_like(p) for p in ours])
    for p, q in zip(ref, ours):
        assert torch.equal(p, q)


@pytest.mark.parametrize("config", CONFIGS, ids=[str(c) for c in CONFIGS])
@pytest.mark.parametrize("in_place", [False, True], ids=["into a slot", "in place"])
def test_a_gradient_as_rows_steps_as_sgd_on_its_product(config: dict[str, Any],
                                                        in_place: bool) -> None:
    """rows [(x1, g1), (x2, g2)] stand for the gradient g1^T x1 + g2^T x2: the GEMMs run
    inside SGD's step (equal up to rounding; Nesterov computes the gradient first); a
    target that is the parameter's own storage is an in-place step."""
    ref, ours = _params()[:2], _params()[:2]
    ref_opt, opt = torch.optim.SGD(ref, **config), torch.optim.SGD(ours, **config)
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        pairs = [(torch.randn(4, 3, generator=gen), torch.randn(4, 5, generator=gen))
                 for _ in range(2)]  # two micro-batches' rows
        bias_grad = torch.randn(3, generator=gen)
        ref[0].grad = sum(g.t() @ x for x, g in pairs)  # type: ignore[assignment]
        ref[1].grad, ours[1].grad = bias_grad, bias_grad.clone()
        ref_opt.step()
        old = ours[0].detach().clone()
        targets = [p.data if in_place else torch.empty_like(p) for p in ours]
        step_into(opt, ours, targets, rows={id(ours[0]): pairs})
        for p, q in zip(ref, ours):
            torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-6)
        assert ours[0].data_ptr() == targets[0].data_ptr()
        assert in_place or not torch.equal(old, ours[0])


def test_a_parameter_of_the_optimizer_not_given_is_refused() -> None:
    params = _params()
    opt = torch.optim.SGD(params, lr=0.1)
    with pytest.raises(ValueError, match="pass all of its parameters"):
        step_into(opt, params[:1], [torch.empty_like(params[0])])


def test_optimizers_it_cannot_stand_in_for() -> None:
    params = _params()
    assert not steps_into(torch.optim.Adam(params, lr=0.1))
    assert not steps_into(torch.optim.SGD(params, lr=0.1, maximize=True))
    assert not steps_into(torch.optim.SGD(params, lr=torch.tensor(0.1)))
    hooked = torch.optim.SGD(params, lr=0.1)
    hooked.register_step_pre_hook(lambda opt, args, kwargs: None)
    assert not steps_into(hooked)
    scheduled = torch.optim.SGD(params, lr=0.1)
    torch.optim.lr_scheduler.StepLR(scheduled, step_size=1)  # wraps `step` to count calls
    assert not steps_into(scheduled)


@pytest.mark.parametrize("decay", [0.0, 0.01])
def test_a_step_from_rows_by_blocks_equals_one_gemm(monkeypatch: pytest.MonkeyPatch,
                                                    decay: float) -> None:
    """On a CPU the out-of-place step from rows goes by blocks of rows that fit in a cache;
    blocks of 2 rows of a 7 x 3 weight give the values of one GEMM over the whole weight."""
    from approxdist.optim import step_into as module
    gen = torch.Generator().manual_seed(3)
    pairs = [(torch.randn(4, 3, generator=gen), torch.randn(4, 7, generator=gen))
             for _ in range(3)]
    results = []
    for block_bytes in (1 << 21, 2 * 3 * 4):
        monkeypatch.setattr(module, "BLOCK_BYTES", block_bytes)
        p = torch.randn(7, 3, generator=torch.Generator().manual_seed(4)).requires_grad_()
        old = p.detach().clone()
        step_into(torch.optim.SGD([p], lr=0.1, weight_decay=decay), [p], [torch.empty_like(p)],
                  rows={id(p): pairs})
        want = old * (1 - 0.1 * decay) - 0.1 * sum(g.t() @ x for x, g in pairs)
        torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-6)
        results.append(p.detach().clone())
    torch.testing.assert_close(results[1], results[0], rtol=1e-6, atol=1e-7)
