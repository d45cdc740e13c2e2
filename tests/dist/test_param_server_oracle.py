"""Parameter server on 4 gloo ranks against one-process oracles, and its modes.

One set of 4 processes runs every case. Through the engine the trainer uses: sync with
1 server + 3 workers and 2 servers + 2 workers must give every parameter of single-process
SGD (momentum, weight decay) on the combined batch within 1e-5; N+b with a persistent
straggler applies exactly N gradients per step, drops the straggler's and lets it skip
the steps taken without it; SSP never lets a worker lead the slowest by more than s;
async records a staleness for every update; and in these three modes every parameter
equals the one-process replay of the push order the server recorded (1e-5, below).

Through `approxdist.ParameterServer` on 3 or 4 of the ranks (1 server, 2 or 3 workers, one
of them sleeping before each step): async, SSP and N+b against a one-process replay of
the push order the server recorded (`tests/helpers/ps_replay.py`): every parameter within
1e-5, with staleness that really happened, `staleness_lr` at its formula, SSP's lead
reaching s and never passing it, and lossy wires (fp8 pushes, bf16 pulls) applied in the
replay too.

No verdict depends on how fast a process runs. The replay holds for any order; what the
orders must show is forced by the rules or by handshakes (`tests/helpers/waiting.Marks`):
every worker starts at version 0, so the W-th gradient of step 0 is at least W - 1
updates stale (async) or dropped (N+b); the engine's N+b straggler pushes step k only once
the other workers have finished step k + 1 (the last step: k), so it is always the one
dropped and it skips the step taken without it; an SSP straggler
starts only once the server has served j steps with W j > (W - 1) s, arrivals of the
others alone, so one of them pushed s + 1 times: a lead of s (`_served_first`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

import approxdist
from approxdist.comm.codecs import get_codec
from approxdist.config.loader import build_config
from approxdist.data import ShardedBatches, TensorDataset
from approxdist.launch.context import DistContext
from approxdist.launch.group import new_group
from approxdist.launch.spawn import run_on_ranks
from approxdist.models import build_model
from approxdist.param_server import shard_by_bytes
from approxdist.topology import Mesh
from approxdist.topology.groups import make_groups
from approxdist.trace import NULL_RECORDER
from approxdist.train.engines.param_server import build_param_server
from tests.helpers.ps_replay import Setup, pushes_of, replay, replay_sharded
from tests.helpers.waiting import Marks

FEATURES, CLASSES, BATCH, STEPS, LR = 10, 4, 24, 3, 0.05


@dataclass(frozen=True)
class Case:
    servers: int
    mode: str = "sync"
    held_back: bool = False  # rank 3 is the straggler, held back by handshakes (`_hold`)
    steps: int = STEPS

    @property
    def workers(self) -> int:
        return 4 - self.servers

    def config(self) -> Any:
        return build_config({
            "train": {"parallel": "ps", "world_size": 4, "seed": 3},
            "model": {"name": "mlp", "hidden": 16, "depth": 2},
            "optim": {"lr": LR, "momentum": 0.9, "weight_decay": 1e-3},
            "data": {"batch_size": BATCH, "augment": False},
            "ps": {"servers": self.servers, "workers": self.workers, "mode": self.mode}})


CASES = [Case(1), Case(2), Case(1, "backup:1", True), Case(1, "ssp:1", True, 8),
         Case(1, "async", False, 6), Case(2, "async", False, 4), Case(2, "ssp:1", False, 4)]
SLOW_RANK = 3


def _data(steps: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(5)
    n = BATCH * steps
    return TensorDataset("toy", torch.randn(n, FEATURES, generator=gen),
                         torch.randint(0, CLASSES, (n,), generator=gen),
                         torch.randn(8, FEATURES, generator=gen),
                         torch.randint(0, CLASSES, (8,), generator=gen), CLASSES)


def _served_first(workers: int, bound: int) -> int:
    """The server steps an SSP straggler waits for before its first step: j steps are
    W j arrivals of the W - 1 others, who can push s + 1 times each before the bound holds
    them (so W j <= (W - 1)(s + 1), or it would wait for ever) and who, with W j > (W - 1) s,
    cannot all have pushed only s times: one pushed s + 1, the last with a lead of s."""
    j = (workers - 1) * (bound + 1) // workers
    assert workers * j > (workers - 1) * bound, (workers, bound)
    return j


def _hold(case: Case, marks: Marks, step: int) -> None:
    """Before rank 3's step `step`: N+b, until the other workers have finished the next step
    (the last: this one), so its gradient arrives after its step's update (dropped) and the
    newest parameters it then gets are a step ahead (it skips); SSP, before its first step,
    until the server has served `_served_first` steps."""
    kind, _, bound = case.mode.partition(":")
    if kind == "backup":
        for rank in range(case.servers, SLOW_RANK):
            marks.wait(f"worker{rank}-{min(step + 1, case.steps - 1)}")
    elif kind == "ssp" and step == 0:
        marks.wait(f"served-{_served_first(case.workers, int(bound))}")


def _run_cases(ctx: DistContext, cases: list[Case], folder: str) -> list[dict[str, Any]]:
    out = []
    for i, case in enumerate(cases):
        cfg, data = case.config(), _data(case.steps)
        groups = make_groups(Mesh.roles(cfg.ps.servers, cfg.ps.workers), ctx)
        engine = build_param_server(cfg, ctx, groups, data, NULL_RECORDER)
        marks = Marks(Path(folder) / f"engine{i}")
        batches = ShardedBatches(data, BATCH, *engine.shard, seed=0, augment=False)
        engine.start()
        records, step = [], 0
        while step < case.steps:  # an N+b worker skips the steps taken without it
            x, y = next(batches.epoch(0, step))
            if case.held_back and ctx.rank == SLOW_RANK:
                _hold(case, marks, step)
            for opt in engine.optimizers:
                for g in opt.param_groups:
                    g["lr"] = LR
            res = engine.train_step(x if engine.feeds_inputs else None,
                                    y if engine.feeds_labels else None, batches.local_batch)
            records.append(dict(res.record))
            marks.mark(f"served-{len(records)}" if engine.ps.is_server
                       else f"worker{ctx.rank}-{step}")
            step += 1 + res.skip
        engine.end_epoch()
        out.append({"params": {n: p.detach().clone() for n, p in engine.module.named_parameters()},
                    "worker": not engine.ps.is_server, "records": records,
                    "summary": engine.summary(), "skipped": engine.ps.skipped})
        engine.close()
    return out


def _model(case: Case) -> nn.Module:
    """The engine's initial model: `train.seed`, then the model section."""
    cfg, data = case.config(), _data(case.steps)
    torch.manual_seed(cfg.train.seed)
    return build_model(cfg.model, data.input_shape, data.num_classes)


def _oracle(case: Case) -> dict[str, torch.Tensor]:
    data = _data(case.steps)
    model = _model(case)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=1e-3)
    for x, y in ShardedBatches(data, BATCH, 0, 1, seed=0, augment=False).epoch(0):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}


#: the slow worker's sleep before each of its steps: it varies the orders the replay
#: meets; no verdict depends on it (the module's docstring)
SLOW_S = 0.04
REPLAY_BATCH = 12


@dataclass(frozen=True)
class Replay:
    """1 server (rank 0) and `workers` workers (ranks 1..workers) of the public class; worker
    `slow` sleeps SLOW_S before each step, so the others run ahead of it (in SSP it also
    waits for the server's `_served_first` steps before its first)."""

    workers: int
    mode: str
    slow: int
    steps: int = 6
    staleness_lr: bool = False
    push: str = "fp32"
    pull: str = "fp32"

    @property
    def setup(self) -> Setup:
        return Setup(self.mode.partition(":")[0], self.workers, LR, 0.9, 1e-3,
                     self.staleness_lr, self.push, self.pull)


REPLAYS = [Replay(2, "async", 1), Replay(3, "async", 2, staleness_lr=True),
           Replay(2, "ssp:1", 1), Replay(3, "ssp:2", 2, 8), Replay(2, "backup:1", 1),
           Replay(3, "backup:1", 0), Replay(3, "async", 2, push="fp8-e4m3", pull="bf16")]


def _replay_model() -> nn.Module:
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, CLASSES))


def _share(case: Replay, worker: int, step: int, epoch: int = 0
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Worker `worker`'s rows of step `step`'s mini-batch (one round: `epoch` is 0)."""
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(REPLAY_BATCH, FEATURES, generator=gen)
    y = torch.randint(0, CLASSES, (REPLAY_BATCH,), generator=gen)
    return x[worker::case.workers], y[worker::case.workers]


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=1e-3)


def _run_replay_case(ctx: DistContext, case: Replay, marks: Marks) -> dict[str, Any]:
    group = new_group(ctx, tuple(range(case.workers + 1)), "replay")
    if group is None:
        return {"server": None}
    ps = approxdist.ParameterServer(_replay_model(), mode=case.mode, steps=case.steps,
                                    optimizer=_sgd, group=group, push_codec=case.push,
                                    pull_codec=case.pull, staleness_lr=case.staleness_lr)
    kind, _, bound = case.mode.partition(":")
    records: list[dict[str, Any]] = []
    if ps.is_server and kind == "ssp":  # serve(), announcing every step served
        for _ in range(case.steps):
            records.append(ps.serve_step())
            marks.mark(f"served-{len(records)}")
        ps.end_round()
    elif ps.is_server:
        records = ps.serve()
    else:
        for step in range(case.steps):  # N+b: ps.step skips the steps taken without it
            if ps.index == case.slow:
                if kind == "ssp" and step == 0:
                    marks.wait(f"served-{_served_first(case.workers, int(bound))}")
                time.sleep(SLOW_S)
            ps.step(*_share(case, ps.index, step))
    out = {"server": ps.is_server, "records": records,
           "params": {n: p.detach().clone() for n, p in ps.module.named_parameters()}}
    ps.close()
    return out


def _ranks(ctx: DistContext, folder: str) -> dict[str, Any]:
    return {"engine": _run_cases(ctx, CASES, folder),
            "replay": [_run_replay_case(ctx, case, Marks(Path(folder) / f"replay{i}"))
                       for i, case in enumerate(REPLAYS)]}


@pytest.fixture(scope="module")
def spawned(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_on_ranks(_ranks, 4, str(tmp_path_factory.mktemp("ps_marks")), timeout_s=240)


@pytest.fixture(scope="module")
def four_ranks(spawned: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [r["engine"] for r in spawned]


@pytest.mark.parametrize("index", [0, 1])
def test_sync_ps_equals_single_process_training(four_ranks: list[list[dict[str, Any]]],
                                                index: int) -> None:
    case, want = CASES[index], _oracle(CASES[index])
    workers = [r[index] for r in four_ranks if r[index]["worker"]]
    assert len(workers) == case.workers
    for w in workers:
        for name, p in want.items():
            torch.testing.assert_close(w["params"][name], p, atol=1e-5, rtol=0, msg=name)
    server0 = four_ranks[0][index]
    assert all(r["staleness"] == [0] * case.workers for r in server0["records"])
    assert server0["summary"]["ps"]["updates"] == STEPS


def test_backup_applies_n_and_the_straggler_skips_ahead(
        four_ranks: list[list[dict[str, Any]]]) -> None:
    server0 = four_ranks[0][2]
    records, ps = server0["records"], server0["summary"]["ps"]
    assert len(records) == ps["updates"] == STEPS
    assert all(sorted(r["applied_from"]) == [0, 1] for r in records)  # N = 3 - 1 per step
    dropped = [w for r in records for w in r["dropped_from"]]
    # every gradient of the straggler came late; having been dropped it went on from the
    # newest parameters, skipping the steps taken without it (its data unused)
    assert set(dropped) == {2} and len(dropped) == ps["dropped"] == ps["pushes"][2] < STEPS
    assert ps["pushes"][:2] == [STEPS, STEPS]
    assert [r[2]["skipped"] for r in four_ranks[1:]] == [0, 0, STEPS - ps["pushes"][2]]
    assert all(s == 0 for r in records for s in r["staleness"])
    workers = [r[2]["params"] for r in four_ranks[1:]]
    for name in workers[0]:  # the straggler ends the epoch with the servers' parameters too
        assert all(torch.equal(w[name], workers[0][name]) for w in workers)


def test_ssp_bounds_the_lead(four_ranks: list[list[dict[str, Any]]]) -> None:
    leads = [x for r in four_ranks[0][3]["records"] for x in r["lead"]]
    assert len(leads) == 3 * 8 and max(leads) <= 1 and max(leads) == 1


def test_async_records_every_update(four_ranks: list[list[dict[str, Any]]]) -> None:
    ps = four_ranks[0][4]["summary"]["ps"]
    stale = [s for r in four_ranks[0][4]["records"] for s in r["staleness"]]
    assert len(stale) == ps["updates"] == 3 * 6
    assert sum(ps["staleness_histogram"].values()) == len(stale) and max(stale) >= 1
    workers = [r[4]["params"] for r in four_ranks if r[4]["worker"]]
    for name in workers[0]:  # every worker pulled the final parameters after the epoch
        assert all(torch.equal(w[name], workers[0][name]) for w in workers)


def _engine_share(case: Case, worker: int, step: int, epoch: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Worker `worker`'s batch of step `step`, as the engine's loop above deals it (one
    round: `epoch` is 0)."""
    batches = ShardedBatches(_data(case.steps), BATCH, worker, case.workers, seed=0,
                             augment=False)
    return next(batches.epoch(0, step))


@pytest.mark.parametrize("index", [i for i, c in enumerate(CASES) if c.mode != "sync"])
def test_the_trainers_engine_equals_the_replayed_push_order(
        four_ranks: list[list[dict[str, Any]]], index: int) -> None:
    """N+b with its straggler, SSP and async through the trainer's engine, on one server and
    (async, SSP) on two: each server's shard equals the one-process replay of the push
    orders the servers recorded (1e-5), as the public class's runs below do; with one server
    the bookkeeping checks above make the orders non-trivial, with two every server applied
    a stale gradient (the second push of step 0 is, whatever the order)."""
    case = CASES[index]
    model = _model(case)
    servers = [four_ranks[k][index] for k in range(case.servers)]
    orders = [pushes_of(s["records"]) for s in servers]
    shards = shard_by_bytes([p.numel() * p.element_size() for p in model.parameters()],
                            case.servers)
    setup = Setup(case.mode.partition(":")[0], case.workers, LR, 0.9, 1e-3)
    want = replay_sharded(model, partial(_engine_share, case), F.cross_entropy, orders,
                          shards, setup)
    names = list(want)
    for server, order, shard in zip(servers, orders, shards):
        assert not server["worker"] and len(order) >= case.steps
        if case.servers > 1:
            assert max(a - p.read for p in order if (a := p.at) is not None) >= 1, order
        for name in (names[i] for i in shard):
            torch.testing.assert_close(server["params"][name], want[name], atol=1e-5, rtol=0,
                                       msg=name)


def _replayed(spawned: list[dict[str, Any]], index: int) -> tuple[dict[str, Any], list[Any]]:
    """The server's result of replay case `index`, and its workers' results."""
    ranks = [r["replay"][index] for r in spawned]
    assert ranks[0]["server"] is True
    return ranks[0], [r for r in ranks[1:] if r["server"] is False]


def _replay_of(index: int, server: dict[str, Any], **change: Any) -> dict[str, torch.Tensor]:
    """Replay case `index`'s recorded order (its setup changed by `change`)."""
    case = REPLAYS[index]
    return replay(_replay_model(), partial(_share, case), F.cross_entropy,
                  pushes_of(server["records"]), dataclasses.replace(case.setup, **change))


@pytest.mark.parametrize("index", range(len(REPLAYS)))
def test_every_parameter_equals_the_replayed_push_order(spawned: list[dict[str, Any]],
                                                        index: int) -> None:
    case = REPLAYS[index]
    server, workers = _replayed(spawned, index)
    want = _replay_of(index, server)
    assert len(workers) == case.workers
    for name, p in want.items():
        torch.testing.assert_close(server["params"][name], p, atol=1e-5, rtol=0, msg=name)
    names = list(want)  # the workers pulled the final parameters, as one vector, in order
    pulled = get_codec(case.pull).roundtrip(torch.cat([server["params"][n].reshape(-1)
                                                       for n in names]))
    for w in workers:
        assert torch.equal(torch.cat([w["params"][n].reshape(-1) for n in names]), pulled)


def test_the_replayed_orders_are_not_trivial(spawned: list[dict[str, Any]]) -> None:
    """Gradients came late (by 2 or more where `staleness_lr` divides by it), SSP's lead
    reached s and never passed it, N+b dropped gradients and averaged N = W - 1 fresh
    ones per update."""
    for index, case in enumerate(REPLAYS):
        records = _replayed(spawned, index)[0]["records"]
        pushes, kind = pushes_of(records), case.setup.kind
        applied = [p for p in pushes if p.at is not None]
        stale = [p.at - p.read for p in applied if p.at is not None]
        if kind in ("async", "ssp"):
            assert len(pushes) == len(applied) == case.workers * case.steps
            assert max(stale) >= (2 if case.staleness_lr else 1), (case, stale)
        if kind == "ssp":
            leads = [x for r in records for x in r["lead"]]
            assert max(leads) == int(case.mode.partition(":")[2]), (case, leads)
        if kind == "backup":
            assert stale == [0] * len(applied) == [0] * (case.workers - 1) * case.steps
            assert len(applied) < len(pushes), case  # the late ones dropped


@pytest.mark.parametrize("change", [{"staleness_lr": False}, {"push": "fp32", "pull": "fp32"}])
def test_the_replay_needs_what_the_run_did(spawned: list[dict[str, Any]],
                                           change: dict[str, Any]) -> None:
    """Without `staleness_lr`'s lr / staleness, or without the wires' codecs, the replay
    misses the run by far more than 1e-5: the match above is not an accident."""
    index = next(i for i, c in enumerate(REPLAYS)
                 if any(getattr(c, k) != v for k, v in change.items()))
    server = _replayed(spawned, index)[0]
    other = _replay_of(index, server, **change)
    gap = max((server["params"][n] - p).abs().max().item() for n, p in other.items())
    assert gap > 1e-4, (change, gap)
