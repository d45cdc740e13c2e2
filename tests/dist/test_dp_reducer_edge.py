"""`DataParallel` edge cases: unused, frozen and rank-dependent parameters; models that differ.

Documented behaviour (docs/data_parallel.md):
* frozen parameters (`requires_grad=False` when wrapping) are never reduced nor changed;
* with `find_unused_parameters=True` a parameter no rank used keeps `.grad = None`
  (exactly single-process training); one used by some ranks only gets their sum / N;
* without it, a parameter with no gradient contributes zeros, so an unused parameter
  gets a zero gradient (weight decay and momentum still move it);
* ranks holding different models get the same `ConfigError` naming the difference.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.data_parallel import DataParallel
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks

STEPS, SHARE = 3, 6


class Branchy(nn.Module):
    """`extra` is used only when asked (rank 0 here), `never` is never used, `a.bias` is frozen."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.extra, self.never, self.head = (nn.Linear(6, 8), nn.Linear(8, 8),
                                                     nn.Linear(8, 8), nn.Linear(8, 3))
        self.a.bias.requires_grad_(False)

    def forward(self, x: torch.Tensor, use_extra: bool) -> torch.Tensor:
        h = F.relu(self.a(x))
        return self.head(h + self.extra(h) if use_extra else h)


def _data(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(11 + rank)
    return [(torch.randn(SHARE, 6, generator=g), torch.randint(0, 3, (SHARE,), generator=g))
            for _ in range(STEPS)]


def _sgd(m: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1, momentum=0.9,
                           weight_decay=0.1)


def _oracle(zero_unused: bool) -> dict[str, torch.Tensor]:
    """Single process on both ranks' samples; optionally with zeros for the never-used grads."""
    m = Branchy()
    opt = _sgd(m)
    for (x0, y0), (x1, y1) in zip(_data(0), _data(1)):
        opt.zero_grad()
        loss = (F.cross_entropy(m(x0, True), y0) + F.cross_entropy(m(x1, False), y1)) / 2
        loss.backward()
        if zero_unused:
            for p in m.never.parameters():
                p.grad = torch.zeros_like(p)
        opt.step()
    return {k: v.detach().clone() for k, v in m.named_parameters()}


def _train(ctx: DistContext, cases: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, options in cases:
        m = Branchy()
        opt = _sgd(m)
        dp = DataParallel(m, ctx=ctx, optimizer=opt, bucket_mb=0.0003, first_bucket_mb=0.0002,
                          **options)
        for x, y in _data(ctx.rank):
            opt.zero_grad()
            F.cross_entropy(dp(x, ctx.rank == 0), y).backward()
            if not dp.owns_step:
                opt.step()
        dp.close()
        out[name] = {k: v.detach().clone() for k, v in m.named_parameters()}
        out[name + ":never.grad"] = m.never.weight.grad
    return out


def test_unused_frozen_and_rank_dependent_parameters() -> None:
    cases = [("find unused", {"find_unused_parameters": True}),
             ("find unused, early forward", {"find_unused_parameters": True, "early_forward": True}),
             ("zeros for unused", {})]
    ranks = run_on_ranks(_train, 2, cases)
    exact, zeros = _oracle(zero_unused=False), _oracle(zero_unused=True)
    assert torch.equal(exact["never.weight"], Branchy().never.weight)  # untouched in the oracle
    assert not torch.equal(zeros["never.weight"], exact["never.weight"])  # weight decay moved it
    for name, ref in (("find unused", exact), ("find unused, early forward", exact),
                      ("zeros for unused", zeros)):
        for pname, value in ref.items():
            torch.testing.assert_close(ranks[0][name][pname], value, atol=1e-5, rtol=0,
                                       msg=f"{name}: {pname}")
            assert torch.equal(ranks[1][name][pname], ranks[0][name][pname]), f"{name}: {pname}"
    assert ranks[0]["find unused:never.grad"] is None
    assert torch.equal(ranks[0]["zeros for unused:never.grad"], torch.zeros(8, 8))
    assert torch.equal(ranks[0]["find unused"]["a.bias"], Branchy().a.bias)  # frozen


def _different_models(ctx: DistContext) -> str:
    m = nn.Sequential(nn.Linear(4, 8 if ctx.rank == 0 else 9), nn.Linear(8 if ctx.rank == 0 else 9, 2))
    try:
        DataParallel(m, ctx=ctx)
    except ConfigError as exc:
        return str(exc)
    return "no error"


def test_different_models_fail_on_every_rank_with_the_difference() -> None:
    messages = run_on_ranks(_different_models, 2)
    assert messages[0] == messages[1]
    assert "'0.weight': shape (8, 4) on rank 0 but (9, 4) on rank 1" in messages[0]
