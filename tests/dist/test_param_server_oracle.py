"""Parameter server on 4 gloo ranks against single-process training, and its modes.

One set of 4 processes runs every case through the engine the trainer uses: sync with
1 server + 3 workers and 2 servers + 2 workers must give every parameter of single-process
SGD (momentum, weight decay) on the combined batch within 1e-5; N+b with a persistent
straggler applies exactly N gradients per step, drops the straggler's and lets it skip
the steps taken without it; SSP never lets a worker lead the slowest by more than s;
async records a staleness for every update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.nn import functional as F  # noqa: N812

from approxdist.config.loader import build_config
from approxdist.data import ShardedBatches, TensorDataset
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.models import build_model
from approxdist.topology import Mesh
from approxdist.topology.groups import make_groups
from approxdist.trace import NULL_RECORDER
from approxdist.train.engines.param_server import build_param_server
from approxdist.train.straggler import Stragglers

FEATURES, CLASSES, BATCH, STEPS, LR = 10, 4, 24, 3, 0.05


@dataclass(frozen=True)
class Case:
    servers: int
    mode: str = "sync"
    straggler: str = ""
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


CASES = [Case(1), Case(2), Case(1, "backup:1", "3:150ms"), Case(1, "ssp:1", "3:20ms", 8),
         Case(1, "async", "", 6)]


def _data(steps: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(5)
    n = BATCH * steps
    return TensorDataset("toy", torch.randn(n, FEATURES, generator=gen),
                         torch.randint(0, CLASSES, (n,), generator=gen),
                         torch.randn(8, FEATURES, generator=gen),
                         torch.randint(0, CLASSES, (8,), generator=gen), CLASSES)


def _run_cases(ctx: DistContext, cases: list[Case]) -> list[dict[str, Any]]:
    out = []
    for case in cases:
        cfg, data = case.config(), _data(case.steps)
        groups = make_groups(Mesh.roles(cfg.ps.servers, cfg.ps.workers), ctx)
        engine = build_param_server(cfg, ctx, groups, data, NULL_RECORDER)
        slow = Stragglers.parse([case.straggler] if case.straggler else [], 4)
        batches = ShardedBatches(data, BATCH, *engine.shard, seed=0, augment=False)
        engine.start()
        records, step = [], 0
        while step < case.steps:  # an N+b worker skips the steps taken without it
            x, y = next(batches.epoch(0, step))
            slow.pause(ctx.rank, step)
            for opt in engine.optimizers:
                for g in opt.param_groups:
                    g["lr"] = LR
            res = engine.train_step(x if engine.feeds_inputs else None,
                                    y if engine.feeds_labels else None, batches.local_batch)
            records.append(dict(res.record))
            step += 1 + res.skip
        engine.end_epoch()
        out.append({"params": {n: p.detach().clone() for n, p in engine.module.named_parameters()},
                    "worker": not engine.ps.is_server, "records": records,
                    "summary": engine.summary(), "skipped": engine.ps.skipped})
        engine.close()
    return out


def _oracle(case: Case) -> dict[str, torch.Tensor]:
    cfg, data = case.config(), _data(case.steps)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=1e-3)
    for x, y in ShardedBatches(data, BATCH, 0, 1, seed=0, augment=False).epoch(0):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def four_ranks() -> list[list[dict[str, Any]]]:
    return run_on_ranks(_run_cases, 4, CASES, timeout_s=240)


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
