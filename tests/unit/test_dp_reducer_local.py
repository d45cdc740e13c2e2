"""`DataParallel` in one process: early forward steps exactly like `optimizer.step()` (seed 001).

With one rank the all-reduce is the identity, so these tests isolate the engine's own
machinery — hooks, buckets, the communication thread, the per-bucket shadow optimizers —
against the plain single-process loop, for several torch optimizers and LR changes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.data_parallel import DataParallel
from approxdist.data_parallel.checks import first_difference, model_signature
from approxdist.errors import ConfigError

Opt = Callable[[list[dict]], torch.optim.Optimizer]


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))


def _groups(m: nn.Module) -> list[dict]:
    """Two param groups: biases without weight decay and a different lr."""
    named = list(m.named_parameters())
    return [{"params": [p for n, p in named if n.endswith("weight")]},
            {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0, "lr": 0.02}]


OPTIMIZERS: dict[str, Opt] = {
    "sgd-nesterov": lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9, nesterov=True,
                                              weight_decay=1e-2),
    "adam": lambda g: torch.optim.Adam(g, lr=1e-2, weight_decay=1e-3),
    "adamw": lambda g: torch.optim.AdamW(g, lr=1e-2),
}


def _batches(k: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(k)]


def _train(make_opt: Opt, engine: bool, **kw: object) -> tuple[nn.Module, torch.optim.Optimizer]:
    m = _net()
    opt = make_opt(_groups(m))
    dp = DataParallel(m, optimizer=opt, early_forward=True, bucket_mb=0.0002,
                      first_bucket_mb=0.0001, **kw) if engine else None  # type: ignore[arg-type]
    for i, (x, y) in enumerate(_batches(4)):
        for g in opt.param_groups:
            g["lr"] *= 0.5 if i else 1.0  # an LR rule, set before the forward as the Trainer does
        F.cross_entropy((dp or m)(x), y).backward()
        if dp is None:
            opt.step()
            opt.zero_grad()
    if dp is not None:
        dp.close()
    return m, opt


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("overlap", [True, False])
def test_early_forward_equals_optimizer_step(name: str, overlap: bool) -> None:
    ref, ref_opt = _train(OPTIMIZERS[name], engine=False)
    got, got_opt = _train(OPTIMIZERS[name], engine=True, overlap=overlap, threads=2)
    for (n, a), b in zip(ref.named_parameters(), got.parameters()):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0, msg=n)
    # the optimizer state (momentum, Adam moments) lives in the user's optimizer
    ref_state, got_state = ref_opt.state_dict()["state"], got_opt.state_dict()["state"]
    assert ref_state.keys() == got_state.keys()
    for k in ref_state:
        for key, value in ref_state[k].items():
            torch.testing.assert_close(got_state[k][key], value, atol=1e-6, rtol=0)


def test_early_forward_refuses_a_user_step_and_needs_the_optimizer() -> None:
    m = _net()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="needs the optimizer"):
        DataParallel(m, early_forward=True)
    dp = DataParallel(m, optimizer=opt, early_forward=True)
    F.cross_entropy(dp(torch.randn(2, 6)), torch.tensor([0, 1])).backward()
    with pytest.raises(ConfigError, match="remove the optimizer.step"):
        opt.step()
    dp.close()


def test_no_sync_accumulates_then_reduces_once() -> None:
    m = _net()
    ref = copy.deepcopy(m)
    dp = DataParallel(m)
    (x1, y1), (x2, y2) = _batches(2)
    with dp.no_sync():
        F.cross_entropy(dp(x1), y1).backward()
    F.cross_entropy(dp(x2), y2).backward()
    F.cross_entropy(ref(x1), y1).backward()
    F.cross_entropy(ref(x2), y2).backward()
    for a, b in zip(ref.parameters(), m.parameters()):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=0)
    dp.close()


def test_model_signature_difference_is_named() -> None:
    a, b = _net(), _net()
    b[2] = nn.Linear(16, 17)
    diff = first_difference(model_signature(a), model_signature(b))
    assert diff is not None and "'2.weight': shape (16, 16) on rank 0 but (17, 16)" in diff
    assert first_difference(model_signature(a), model_signature(_net())) is None
