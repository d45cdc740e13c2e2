"""The delay rule through the public classes (one spawn of 3 ranks).

2BW on 2 stages (ranks 0, 1) trains a quadratic: each stage's parameter is a shift c_s
added after a fixed linear map, so the loss is quadratic in (c_0, c_1) with a constant
Hessian H. With lr x lambda_max(H) = 0.3 the stability bound (`optim.stable_rate`) says:
synchronous SGD with momentum 0.9 converges (0.3 < 3.8), 2BW's one-step-late gradient with
momentum 0.9 diverges (0.3 > 1 - 0.9) and with the rule's momentum 0.4 converges
(0.3 < 0.6). Each run must equal its one-process oracle, the delayed heavy ball
w(t+1) = w(t) + b (w(t) - w(t-1)) - lr grad L(w(t-d)) with d = 1 (w(-1) = w(0), as 2BW's
first two mini-batches run on version 0) or d = 0 for 1F1B, within 1e-5 (fp32), and the
excess loss must fall or grow as the bound says. PipeDream's stages and the parameter
server's optimisers get the rule's momentum per delay, and the line a run prints.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

import approxdist
from approxdist.errors import ConfigError
from approxdist.launch.context import DistContext
from approxdist.launch.group import new_group
from approxdist.launch.spawn import run_on_ranks
from approxdist.optim.delay import stable_rate

WIDTH, BATCH, STEPS, RATE = 4, 8, 40, 0.3


class Shift(nn.Module):
    """x @ P + c: a fixed map P (a buffer) and a trained shift c."""

    def __init__(self, p: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("p", p)
        self.c = nn.Parameter(torch.zeros(p.shape[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.p + self.c


def _model() -> nn.Sequential:
    gen = torch.Generator().manual_seed(3)
    return nn.Sequential(Shift(torch.randn(WIDTH, WIDTH, generator=gen)),
                         Shift(torch.randn(WIDTH, 2, generator=gen) / 2))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(4)
    return torch.randn(BATCH, WIDTH, generator=gen), torch.randn(BATCH, 2, generator=gen)


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _lr() -> float:
    """RATE / lambda_max of the loss's Hessian in (c_0, c_1), constant: it is quadratic."""
    model, (x, y) = _model(), _data()
    shapes = [p.shape for p in model.parameters()]

    p0, p1 = model[0].p.double(), model[1].p.double()

    def loss(theta: torch.Tensor) -> torch.Tensor:
        c0, c1 = theta[:shapes[0][0]], theta[shapes[0][0]:]
        return F.mse_loss((x.double() @ p0 + c0) @ p1 + c1, y.double())

    h = torch.autograd.functional.hessian(loss, _flat(model).double())
    return RATE / float(torch.linalg.eigvalsh(h).max())


def _oracle(momentum: float, delay: int, lr: float) -> torch.Tensor:
    """The delayed heavy ball in one process with torch's SGD: the gradient of step t is
    taken at the weights of step max(t - delay, 0)."""
    model, (x, y) = _model(), _data()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    history = [_flat(model)]
    for t in range(STEPS):
        stale = _model()
        torch.nn.utils.vector_to_parameters(history[max(t - delay, 0)], stale.parameters())
        F.mse_loss(stale(x), y).backward()
        for p, q in zip(model.parameters(), stale.parameters()):
            p.grad = q.grad
        opt.step()
        history.append(_flat(model))
    return history[-1]


def _excess(theta: torch.Tensor) -> float:
    """The loss at `theta` above its minimum (the best constant shift of the outputs)."""
    model, (x, y) = _model(), _data()
    torch.nn.utils.vector_to_parameters(theta, model.parameters())
    with torch.no_grad():
        fixed = x @ model[0].p @ model[1].p
        best = F.mse_loss(fixed + (y - fixed).mean(0), y)
        return float(F.mse_loss(model(x), y) - best)


def _pipeline(group: Any, schedule: str, lr: float, **kwargs: Any) -> dict[str, Any]:
    x, y = _data()
    model = _model()
    sgd = lambda ps: torch.optim.SGD(ps, lr=lr, momentum=0.9)  # noqa: E731
    if schedule == "1f1b":
        pipe = approxdist.Pipeline(model, sample=x[:2], schedule="1f1b", microbatches=2,
                                   loss_fn=F.mse_loss, group=group)
        opt = sgd(pipe.parameters())
        for _ in range(STEPS):
            pipe.step(x, y)
            opt.step()
            opt.zero_grad()
    else:
        pipe = approxdist.Pipeline(model, sample=x[:2], schedule=schedule, microbatches=2,
                                   loss_fn=F.mse_loss, group=group, optimizer=sgd,
                                   stream=STEPS, **kwargs)
        opt = pipe.optimizer
        for _ in range(STEPS):
            pipe.step(x, y)
    out = {"param": pipe.module[0].c.detach().clone(), "stage": pipe.stage,
           "momentum": opt.param_groups[0]["momentum"], "line": pipe.delay_line}
    pipe.close()
    return out


def _ps(mode: str, **kwargs: Any) -> dict[str, Any]:
    x, y = _data()
    ps = approxdist.ParameterServer(_model(), servers=1, mode=mode, steps=2, loss_fn=F.mse_loss,
                                    optimizer=lambda ps: torch.optim.SGD(ps, lr=0.01,
                                                                         momentum=0.9),
                                    **kwargs)
    out: dict[str, Any] = {"server": ps.is_server, "line": ps.delay_line}
    if ps.is_server:
        ps.serve()
        assert ps.optimizer is not None
        out["momentum"] = ps.optimizer.param_groups[0]["momentum"]
    else:
        for _ in range(2):
            ps.step(x, y)
    ps.close()
    return out


def _ranks(ctx: DistContext) -> dict[str, Any]:
    lr = _lr()
    group = new_group(ctx, [0, 1], "pipeline")
    out: dict[str, Any] = {"lr": lr}
    if group is not None:
        out["2bw"] = _pipeline(group, "2bw", lr)
        out["2bw-off"] = _pipeline(group, "2bw", lr, delay_rule="off")
        out["1f1b"] = _pipeline(group, "1f1b", lr)
        out["pipedream"] = _pipeline(group, "pipedream", lr)
    out["ps"] = {mode: _ps(mode) for mode in ("sync", "async", "ssp:1")}
    out["ps-off"] = _ps("async", delay_rule="off")
    with pytest.raises(ConfigError) as info:
        approxdist.ParameterServer(_model(), steps=2, mode="async", delay_rule="on",
                                   optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    out["refused"] = str(info.value)
    return out


@pytest.fixture(scope="module")
def three_ranks() -> list[dict[str, Any]]:
    return run_on_ranks(_ranks, 3, timeout_s=180)


def _theta(ranks: list[dict[str, Any]], run: str) -> torch.Tensor:
    """Both stages' shifts, stage 0's first (each rank holds its stage's)."""
    rows = sorted((r[run] for r in ranks[:2]), key=lambda row: row["stage"])
    return torch.cat([rows[0]["param"], rows[1]["param"]])


def test_the_bound_sorts_the_three_runs() -> None:
    assert stable_rate(0.9, 1) < RATE < stable_rate(0.4, 1) < stable_rate(0.9, 0)


@pytest.mark.parametrize(("run", "momentum", "delay", "converges"),
                         [("2bw", 0.4, 1, True), ("2bw-off", 0.9, 1, False),
                          ("1f1b", 0.9, 0, True)])
def test_each_run_is_its_delayed_heavy_ball_and_meets_the_bound(
        three_ranks: list[dict[str, Any]], run: str, momentum: float, delay: int,
        converges: bool) -> None:
    lr = three_ranks[0]["lr"]
    got = _theta(three_ranks, run)
    want = _oracle(momentum, delay, lr)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert [r[run]["momentum"] for r in three_ranks[:2]] == [pytest.approx(momentum)] * 2
    start, end = _excess(_flat(_model())), _excess(got)
    assert (end < start) is converges, (start, end)


def test_the_rule_runs_each_stage_and_server_at_its_delays_momentum(
        three_ranks: list[dict[str, Any]]) -> None:
    pd = sorted((r["pipedream"] for r in three_ranks[:2]), key=lambda row: row["stage"])
    assert [row["momentum"] for row in pd] == [pytest.approx(0.4), 0.9]  # delays 1, 0
    assert pd[0]["line"] == pd[1]["line"] and pd[0]["line"].startswith(
        "note: gradients arrive 1, 0 steps late on stages 0-1 (pipedream)")
    assert three_ranks[0]["2bw-off"]["line"].startswith("warning: momentum 0.9 with gradients "
                                                        "1 step late on stages 0-1 (2bw)")
    assert three_ranks[0]["1f1b"]["line"] is None
    server = three_ranks[0]["ps"]  # 1 server, 2 workers: async and SSP are 1 update late
    assert [server[m]["momentum"] for m in ("sync", "async", "ssp:1")] == \
        [0.9, pytest.approx(0.4), pytest.approx(0.4)]
    assert server["sync"]["line"] is None
    assert server["async"]["line"].startswith("note: gradients arrive 1 step late at the "
                                              "servers (async, 2 workers)")
    assert three_ranks[0]["ps-off"]["momentum"] == 0.9
    assert three_ranks[0]["ps-off"]["line"].startswith("warning: momentum 0.9")
    assert all(r["ps"]["async"]["line"] is None for r in three_ranks[1:])  # workers
    assert three_ranks[0]["refused"] == ("delay_rule='on' is not one of: auto, off (auto "
                                         "lowers momentum by a gradient delay's implicit "
                                         "momentum)")
