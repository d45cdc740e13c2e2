"""`approxdist.ParameterServer` from a user's own loop, on 3 gloo ranks: a model of the
user's own (not one of approxdist's) with the user's loss and optimiser against
single-process training on the combined batch (sync with 2 workers, sync sharded over 2
servers, async with 1 worker, sync with a learning-rate schedule on 1 and 2 servers); SSP
and N+b invariants; bad arguments; the documented
example (examples/ps_api.py) trains. One set of processes runs every case."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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
from approxdist.trace.recorder import Recorder
from tests.helpers.examples import load_example

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ps_api.py"
BATCH, STEPS = 12, 3


class Gated(nn.Module):
    """A user's own model: a gated residual block between two linear layers."""

    def __init__(self, out: int) -> None:
        super().__init__()
        self.inp, self.gate, self.value = nn.Linear(6, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.head = nn.Linear(16, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        return self.head(h + torch.sigmoid(self.gate(h)) * torch.tanh(self.value(h)))


def _huber(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.smooth_l1_loss(out, y)


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)


def _adam(params: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=0.01)


def _warmup(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 3))


def _linear(opt: torch.optim.Optimizer) -> Any:
    return torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=3)


@dataclass(frozen=True)
class Case:
    """`servers` and `workers` as the API takes them, on ranks 0, 1, 2."""

    servers: Any
    workers: Any
    mode: str
    task: str  # classification (cross-entropy) or regression (the user's Huber loss)
    optimizer: Callable[[Any], torch.optim.Optimizer]
    steps: int = STEPS
    group: tuple[int, ...] = ()  # the ranks of `group=`, in order (default: the world)
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None

    @property
    def loss_fn(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return F.cross_entropy if self.task == "classification" else _huber


ORACLE_CASES = [Case(1, 2, "sync", "classification", _sgd),
                Case([1, 2], [0], "sync", "regression", _adam),
                Case(2, None, "async", "classification", _sgd, 4),
                Case(1, None, "async", "regression", _adam, 3, (2, 0)),
                Case(1, 2, "sync", "classification", _sgd, 4, scheduler=_warmup),
                Case([1, 2], [0], "sync", "regression", _adam, 4, scheduler=_linear)]
#: which ranks serve in each oracle case (counts take the group's ranks in order; None:
#: outside the group)
SERVING = [[True, False, False], [False, True, True], [True, True, False], [False, None, True],
           [True, False, False], [False, True, True]]


def _model(task: str) -> nn.Module:
    torch.manual_seed(0)
    return Gated(3 if task == "classification" else 2)


def _batches(task: str, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)
    out = []
    for _ in range(steps):
        x = torch.randn(BATCH, 6, generator=gen)
        y = torch.randint(0, 3, (BATCH,), generator=gen) if task == "classification" else \
            torch.randn(BATCH, 2, generator=gen)
        out.append((x, y))
    return out


def _run(ctx: DistContext, case: Case) -> dict[str, Any]:
    group = new_group(ctx, case.group, "ps") if case.group else None
    if case.group and group is None:
        return {"server": None}
    ps = approxdist.ParameterServer(_model(case.task), servers=case.servers,
                                    workers=case.workers, mode=case.mode, steps=case.steps,
                                    optimizer=case.optimizer, loss_fn=case.loss_fn, group=group,
                                    scheduler=case.scheduler)
    out: dict[str, Any] = {"server": ps.is_server, "losses": [], "records": []}
    if ps.is_server:
        out["records"] = ps.serve()
        assert ps.optimizer is not None
        out["lr"] = [g["lr"] for g in ps.optimizer.param_groups]
    else:
        w, n = ps.index, ps.roles.workers
        for x, y in _batches(case.task, case.steps):
            out["losses"].append(ps.step(x[w::n], y[w::n]))
    out["params"] = {k: p.detach().clone() for k, p in ps.module.named_parameters()}
    out["summary"], out["skipped"] = ps.summary(), ps.skipped
    ps.close()
    return out


def _refusals(ctx: DistContext) -> list[str]:
    """Bad arguments, each refused on every rank before anything is sent."""
    model, messages = _model("classification"), []
    for kwargs in ({"mode": "ssp"}, {"servers": 3}, {"workers": 5}, {"servers": [0, 1],
                   "workers": [1, 2]}, {"push_codec": "fp33"}, {"steps": 0},
                   {"mode": "backup:2"}, {"servers": [0], "workers": [1]},
                   {"link": "bw=fast"}, {"optimizer": "sgd"}, {"scheduler": "linear"},
                   {"scheduler": lambda opt: 3}):
        args = {"steps": 2, "optimizer": _sgd, **kwargs}
        with pytest.raises(ConfigError) as info:
            approxdist.ParameterServer(model, **args)
        messages.append(str(info.value))
    ps = approxdist.ParameterServer(model, steps=1, optimizer=_sgd)
    x, y = torch.zeros(2, 6), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ConfigError) as info:
        if ps.is_server:
            ps.step(x, y)
        else:
            ps.serve()
    messages.append(str(info.value))
    if ps.is_server:  # the round the workers step
        ps.serve()
    else:
        ps.step(x, y)
    ps.close()
    with pytest.raises(ConfigError) as info:  # what it cannot honour, never ignored
        approxdist.ParameterServer(model, steps=2, optimizer=_sgd, tolerate_worker_loss=True)
    messages.append(str(info.value))
    return messages


def _state_and_trace(ctx: DistContext) -> dict[str, Any]:
    """A recorder sees every phase; a saved state put back after the weights moved
    restores every server's shard (the workers pull it again)."""
    rec = Recorder(ctx.rank, profiler="never")
    ps = approxdist.ParameterServer(_model("classification"), steps=2, optimizer=_sgd,
                                    push_codec="bf16", error_feedback=True, recorder=rec)
    x, y = _batches("classification", 2)[0]
    if ps.is_server:
        ps.serve()
    else:
        ps.step(x, y)
        ps.step(x, y)
    state = ps.state_dict()
    saved = {k: p.detach().clone() for k, p in ps.module.named_parameters()}
    with torch.no_grad():
        for p in ps.module.parameters():
            p.add_(1.0)
        for p in (ps.server.params if ps.server is not None else []):
            p.add_(1.0)
    ps.load_state_dict(state)
    back = {k: p.detach().clone() for k, p in ps.module.named_parameters()}
    ps.close()
    return {"server": ps.is_server, "phases": sorted({e[0] for e in rec.events}),
            "saved": saved, "back": back, "servers": len(state["servers"]),
            "feedback": sorted(state["feedback"])}


def _ranks(ctx: DistContext) -> dict[str, Any]:
    out: dict[str, Any] = {"oracle": [_run(ctx, case) for case in ORACLE_CASES]}
    out["ssp"] = _run(ctx, Case(1, 2, "ssp:1", "classification", _sgd, 6))
    out["backup"] = _run(ctx, Case(1, 2, "backup:1", "classification", _sgd, 6))
    out["refused"] = _refusals(ctx)
    out["state"] = _state_and_trace(ctx)
    example = load_example(EXAMPLE, "ps_api_example")
    out["example"] = example.main(steps=30)
    return out


@pytest.fixture(scope="module")
def three_ranks() -> list[dict[str, Any]]:
    return run_on_ranks(_ranks, 3, timeout_s=240)


def _oracle(case: Case) -> tuple[dict[str, torch.Tensor], list[float], float]:
    """Single-process training on the combined batches (the scheduler stepped after each
    optimiser step), its losses and its final learning rate."""
    model = _model(case.task)
    opt = case.optimizer(list(model.parameters()))
    sched = case.scheduler(opt) if case.scheduler else None
    losses = []
    for x, y in _batches(case.task, case.steps):
        opt.zero_grad()
        loss = case.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(float(loss.detach()))
    return ({k: p.detach() for k, p in model.named_parameters()}, losses,
            opt.param_groups[0]["lr"])


@pytest.mark.parametrize("index", range(len(ORACLE_CASES)))
def test_the_public_ps_equals_single_process_training(three_ranks: list[dict[str, Any]],
                                                      index: int) -> None:
    case = ORACLE_CASES[index]
    want, losses, lr = _oracle(case)
    runs = [r["oracle"][index] for r in three_ranks]
    assert [r["server"] for r in runs] == SERVING[index]
    workers = [r for r in runs if r["server"] is False]
    for w in workers:
        for name, p in want.items():
            torch.testing.assert_close(w["params"][name], p, atol=1e-5, rtol=0, msg=name)
    if len(workers) == 1:  # the only worker's losses are the single process's
        assert workers[0]["losses"] == pytest.approx(losses, rel=1e-5)
    servers = [r for r in runs if r["server"] is True]
    assert sum(s["summary"]["updates"] for s in servers) == case.steps * len(servers)
    assert all(x == 0 for s in servers for rec in s["records"] for x in rec["staleness"])
    assert all(s["lr"] == [pytest.approx(lr, rel=1e-12)] for s in servers)


def test_ssp_bounds_the_lead_and_backup_applies_n(three_ranks: list[dict[str, Any]]) -> None:
    leads = [x for rec in three_ranks[0]["ssp"]["records"] for x in rec["lead"]]
    assert len(leads) == 2 * 6 and max(leads) <= 1
    records = three_ranks[0]["backup"]["records"]
    assert len(records) == 6 and all(len(rec["applied_from"]) == 1 for rec in records)
    for r in three_ranks[1:]:  # a skipped mini-batch returns None and counts as skipped
        run = r["backup"]
        assert len(run["losses"]) == 6
        assert sum(v is None for v in run["losses"]) == run["skipped"]
    workers = [r["backup"]["params"] for r in three_ranks[1:]]
    for name, p in workers[0].items():  # both end the round on the servers' parameters
        assert torch.equal(workers[1][name], p), name


def test_bad_arguments_are_refused_in_one_line(three_ranks: list[dict[str, Any]]) -> None:
    got = three_ranks[1]["refused"]
    assert got[0].startswith("mode='ssp' is not one of: sync, async, ssp:<s>")
    assert got[1] == ("servers=3 must be >= 1 and leave at least one of the 3 ranks for the "
                      "workers; e.g. servers=1")
    assert got[2] == ("servers=1 and workers=5 make 6 rank(s) but the group has 3; use "
                      "workers=2 (or leave it out)")
    assert got[3] == ("servers=[0, 1] and workers=[1, 2] both name rank(s) [1]; give each "
                      "rank one role")
    assert got[4].startswith("push_codec='fp33': unknown codec spec 'fp33'; valid forms:")
    assert got[5].startswith("steps=0 must be the number of mini-batches each worker steps")
    assert got[6].startswith("mode='backup:2': b = 2 backup workers leaves no gradient of the "
                             "2 worker(s) to use; use b <= 1")
    assert got[7] == ("servers=[0] and workers=[1] leave rank(s) [2] of the group without a "
                      "role; name every rank of the group once (or pass group= of the ranks "
                      "used)")
    assert got[8] == "link='bw=fast': bandwidth 'fast' is not <number><unit>; e.g. bw=100mbit"
    assert got[9] == ("optimizer='sgd' must be a function of a server's parameters, e.g. "
                      "optimizer=lambda params: torch.optim.SGD(params, lr=0.1)")
    assert got[10] == ("scheduler='linear' must be a function of a server's optimizer, e.g. "
                       "scheduler=lambda opt: torch.optim.lr_scheduler.LinearLR(opt, 0.1, "
                       "total_iters=100)")
    for r in three_ranks:  # found on the server, raised on the workers too
        assert r["refused"][11].startswith("scheduler= returned int, which has no step(); "
                                           "return a learning-rate scheduler")
    assert got[12].startswith("worker 0 (rank 1) computes gradients: call step(inputs, "
                              "targets) on it, not serve()")
    assert three_ranks[0]["refused"][12].startswith("server 0 (rank 0) holds parameters: call "
                                                   "serve() on it, not step()")


def test_the_cli_options_are_arguments_and_the_state_round_trips(
        three_ranks: list[dict[str, Any]]) -> None:
    assert three_ranks[0]["refused"][13] == (
        "tolerate_worker_loss=True with mode='sync': every step waits for a gradient from "
        "every worker, so a dead worker must end the run; use mode='async', 'ssp:<s>' or "
        "'backup:<b>'")
    for r in three_ranks:
        st = r["state"]
        assert st["servers"] == 1 and st["feedback"] == ["0", "1"]
        assert ("sync" in st["phases"]) and (st["server"] or "run_back" in st["phases"])
        assert ("push" in st["phases"]) == st["server"]  # a marker per push it took
        if not st["server"]:  # the workers pulled the restored servers' parameters back
            for name, p in st["saved"].items():
                assert torch.equal(st["back"][name], p), name


def test_the_example_trains(three_ranks: list[dict[str, Any]]) -> None:
    assert three_ranks[0]["example"] == []
    for r in three_ranks[1:]:
        losses = r["example"]
        assert len(losses) == 30 and losses[-1] < 0.5 * losses[0]


def test_without_a_process_group_the_api_says_what_to_do() -> None:
    with pytest.raises(ConfigError, match=r"needs torch.distributed: call "
                       r"dist.init_process_group\(...\) on every rank first"):
        approxdist.ParameterServer(_model("classification"), steps=1, optimizer=_sgd)


def test_the_docs_show_the_example_as_it_is() -> None:
    docs = (EXAMPLE.parents[1] / "docs" / "api.md").read_text()
    section = docs[docs.index("## `approxdist.ParameterServer`"):]
    block = section[section.index("```python\n") + 10:]
    block = block[:block.index("```")]
    source = EXAMPLE.read_text()
    assert block == source[source.index("from __future__"):]
