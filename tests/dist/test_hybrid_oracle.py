"""Hybrid parallelism against the single-process oracle: replicated stages, equal and unequal.

One set of 4 processes runs every case: a topology (2x2, 3+1, 1+3, 1+2+1), a schedule
(GPipe, 1F1B, ZB-H1, ZB-H2), micro-batches dealt round robin to each stage's replicas, the replicas'
gradients summed during the last micro-batch's backward. After one training step the
loss and every parameter's gradient equal single-process training on the same global
batch split into the same micro-batches (1e-5, no batch norm), and a stage's replicas
hold bitwise the same gradients, also with a lossy all-reduce codec (bf16, error
feedback), whose gradients lie within the all-reduce's documented bound of the exact sum,
(N + 2) 2^-8 sum_i |g_i| over the replicas' gradients g_i. A second step reuses every
buffer and must give the same loss again. With a compressor on the replicas' wire (top-k,
PowerSGD), a stage's gradient equals one process compressing each replica's gradient and
summing (1e-5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import Any

import pytest
import torch
from torch.nn import functional as F  # noqa: N812

from approxdist.comm.compressors import Where, get_compressor
from approxdist.config.loader import build_config
from approxdist.hybrid import build_hybrid_runtime
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.models.mlp import mlp
from approxdist.pipeline.microbatch import split_microbatches
from approxdist.topology import Mesh
from approxdist.topology.groups import make_groups
from tests.helpers.collective_oracles import RELATIVE
from tests.helpers.lockstep import lockstep

FEATURES, CLASSES, HIDDEN, BATCH = 12, 5, 16, 24
#: fp32: the oracle adds the micro-batches' gradients in another order than the stages
FP32 = 1e-5


@dataclass(frozen=True)
class Case:
    replicas: tuple[int, ...]
    schedule: str
    microbatches: int
    dp: dict[str, Any] = field(default_factory=dict)
    grad: dict[str, Any] = field(default_factory=dict)  # the replicas' gradient wire
    recompute: bool = False
    threads: str = "inline"  # seed 002's communication-thread strategy

    def sections(self) -> dict[str, dict[str, Any]]:
        return {"train": {"parallel": "hybrid", "world_size": 4, "seed": 0},
                "pipeline": {"stages": len(self.replicas), "replicas": list(self.replicas),
                             "schedule": self.schedule, "microbatches": self.microbatches,
                             "recompute": self.recompute, "fuse_accumulation": "all",
                             "comm_threads": self.threads},
                "dp": {"bucket_mb": 0.0005, "first_bucket_mb": 0.0002, **self.dp},
                "wire": {"grad": self.grad}}


CASES = [
    Case((2, 2), "gpipe", 4), Case((2, 2), "1f1b", 4),
    Case((3, 1), "gpipe", 6), Case((3, 1), "1f1b", 4),  # 4 micro-batches on 3 replicas: 2, 1, 1
    Case((1, 3), "1f1b", 6), Case((1, 3), "gpipe", 3, recompute=True),
    Case((1, 2, 1), "gpipe", 4), Case((1, 2, 1), "1f1b", 5, dp={"algorithm": "brd"}),
    Case((2, 2), "1f1b", 4, dp={"algorithm": "ring"},
         grad={"codec": "bf16", "error_feedback": True}),
    *[Case((3, 1), "1f1b", 6, threads=t) for t in ("per-message", "sa", "sra")],
    *[Case((1, 2, 1), "gpipe", 4, threads=t) for t in ("per-message", "sa", "sra")],
    Case((2, 2), "1f1b", 8, threads="sra"), Case((1, 2, 1), "1f1b", 8, threads="sra"),
    # zero bubble: split backwards, the replicas' all-reduce after the last W
    Case((2, 2), "zbh1", 4), Case((3, 1), "zbh1", 6, recompute=True), Case((1, 2, 1), "zbh2", 6),
]


#: compressors on the replicas' gradient wire (docs/compressors.md), after CASES in one spawn
COMPRESSED = [
    Case((2, 2), "gpipe", 4, dp={"algorithm": "ring"}, grad={"codec": "topk:0.25"}),
    Case((2, 2), "1f1b", 4, grad={"codec": "powersgd:2", "rules": ["*.bias=fp32"]}),
]


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return mlp((FEATURES,), CLASSES, hidden=HIDDEN, depth=4)  # 5 blocks, no batch norm


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return (torch.randn(BATCH, FEATURES, generator=gen),
            torch.randint(0, CLASSES, (BATCH,), generator=gen))


def _run_cases(ctx: DistContext, cases: list[Case]) -> list[dict[str, Any]]:
    out = []
    for case in cases:
        cfg = build_config(case.sections())
        groups = make_groups(Mesh.stages(len(case.replicas), case.replicas), ctx,
                             lanes={("dp",): cfg.dp.threads + 2})
        x, y = _data()
        rt = build_hybrid_runtime(cfg.pipeline, cfg.dp, cfg.wire, _model(), ctx, groups, x[:2],
                                  link=cfg.comm.link, seed=cfg.train.seed)
        first, last = rt.transport.is_first, rt.transport.is_last
        res = rt.executor.train_step(x if first else None, y if last else None, BATCH)
        grads = {n: p.grad.clone() for n, p in rt.module.named_parameters()}
        for p in rt.module.parameters():
            p.grad = None
        again = rt.executor.train_step(x if first else None, y if last else None, BATCH)
        out.append({"stage": rt.stage, "loss": res.loss if last else None,
                    "threads": rt.transport.courier.threads,
                    "samples": res.samples, "loss2": again.loss if last else None,
                    "grads": grads, "sent": rt.link.stats.bytes_sent,
                    "synced": rt.grad_sync is not None})
        rt.close()
    return out


def _oracle(case: Case) -> tuple[float, dict[str, torch.Tensor]]:
    model, (x, y) = _model(), _data()
    total = 0.0
    for mb in split_microbatches(x, y, case.microbatches):
        loss = F.cross_entropy(model(mb.inputs), mb.labels) * mb.weight
        loss.backward()
        total += float(loss.detach())
    return total, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def four_ranks() -> list[list[dict[str, Any]]]:
    return run_on_ranks(_run_cases, 4, CASES + COMPRESSED, timeout_s=240)


def _compressed_oracle(case: Case) -> dict[str, torch.Tensor]:
    """Each replica's gradient (its micro-batches, m mod 2 = its index, weighted by their
    share of the batch) compressed as its own worker, combined as the collective would,
    times 2: the replicas sum; a rule's exact parameters are summed as they are."""
    model = _model()
    per_replica = _replica_grads(case, 2)
    exact = [rule.partition("=")[0] for rule in case.grad.get("rules", [])]
    out = {}
    for n, p in model.named_parameters():
        pair = [g[n] for g in per_replica]
        if any(fnmatch(n, glob) for glob in exact):
            out[n] = pair[0] + pair[1]
            continue
        comps = [get_compressor(case.grad["codec"], Where(tuple(p.shape), n, worker=r))
                 for r in range(2)]
        out[n] = lockstep(comps, pair)[0] * 2
    return out


@pytest.mark.parametrize("index", range(len(COMPRESSED)))
def test_replicas_compressing_their_gradients_match_one_process(
        four_ranks: list[list[dict[str, Any]]], index: int) -> None:
    case = COMPRESSED[index]
    expected = _compressed_oracle(case)
    _, uncompressed = _oracle(case)
    assert any(not torch.allclose(v, uncompressed[n], atol=1e-3) for n, v in expected.items())
    ranks = [r[len(CASES) + index] for r in four_ranks]
    for stage in range(2):
        mine = [r for r in ranks if r["stage"] == stage]
        for name, g in mine[0]["grads"].items():
            assert torch.equal(mine[1]["grads"][name], g), (case, stage, name)
            torch.testing.assert_close(g, expected[name], atol=1e-5, rtol=0,
                                       msg=f"{case} {name}")


@pytest.mark.parametrize("index", range(len(CASES)))
def test_replicated_stages_match_single_process_training(four_ranks: list[list[dict[str, Any]]],
                                                         index: int) -> None:
    case = CASES[index]
    loss, grads = _oracle(case)
    ranks = [r[index] for r in four_ranks]
    lossy = case.grad.get("codec", "fp32") != "fp32"
    last = [r for r in ranks if r["loss"] is not None]
    assert len(last) == case.replicas[-1]
    assert sum(r["loss"] for r in last) == pytest.approx(loss, abs=1e-5), case
    assert sum(r["loss2"] for r in last) == pytest.approx(loss, abs=1e-5), case  # buffers reused
    assert sum(r["samples"] for r in last) == BATCH
    seen: set[str] = set()
    rounded = []  # with a lossy codec: did the wire change a replicated stage's sum?
    for stage, count in enumerate(case.replicas):
        mine = [r for r in ranks if r["stage"] == stage]
        assert len(mine) == count and all(r["synced"] == (count > 1) for r in mine)
        for name, g in mine[0]["grads"].items():
            for other in mine[1:]:  # replicas agree bit for bit, whatever the codec
                assert torch.equal(other["grads"][name], g), (case, stage, name)
            if lossy and count > 1:  # the all-reduce's bound around the exact sum
                err = (g - grads[name]).abs()
                assert bool((err <= FP32 + _lossy_bound(case, count, name)).all()), \
                    (case, name, float(err.max()))
                rounded.append(bool((err > FP32).any()))
            else:
                torch.testing.assert_close(g, grads[name], atol=FP32, rtol=0,
                                           msg=f"{case} {name}")
            seen.add(name)
    assert seen == set(grads), f"{case}: parameters without a stage: {set(grads) - seen}"
    assert not lossy or any(rounded), f"{case}: the lossy codec changed nothing"
    assert all(r["sent"] > 0 for r in ranks)
    threads = [r["threads"] for r in ranks]  # per peer and direction, or per peer (sra)
    if case.threads == "inline":
        assert threads == [0] * 4
    else:
        peers = [len(set(_peers(case, r["stage"]))) for r in ranks]
        per = {"per-message": 2, "sa": 2, "sra": 1}[case.threads]
        assert all(t <= per * p for t, p in zip(threads, peers)) and max(threads) > 0


def _replica_grads(case: Case, count: int) -> list[dict[str, torch.Tensor]]:
    """Each of `count` replicas' gradient of the whole model: micro-batch m goes to replica
    m mod count, weighted by its share of the batch (what the replica holds before the sum)."""
    model, (x, y) = _model(), _data()
    out = []
    for r in range(count):
        model.zero_grad()
        for m, mb in enumerate(split_microbatches(x, y, case.microbatches)):
            if m % count == r:
                (F.cross_entropy(model(mb.inputs), mb.labels) * mb.weight).backward()
        out.append({n: p.grad.clone() for n, p in model.named_parameters()})
    return out


def _lossy_bound(case: Case, count: int, name: str) -> torch.Tensor:
    """|ours - exact sum| allowed for parameter `name` summed over `count` replicas with the
    case's lossy codec: (N + 2) u sum_i |g_i| (docs/collectives.md: a value is re-encoded at
    most N + 2 times; u = 2^-8 for bf16). The first step's error-feedback residuals are
    zero, so the step sends the gradients themselves."""
    u = RELATIVE[case.grad["codec"]][0]
    mag = sum(g[name].abs() for g in _replica_grads(case, count))
    return (count + 2) * u * mag  # type: ignore[return-value]


def _peers(case: Case, stage: int) -> list[int]:
    """Every rank a replica of `stage` exchanges messages with (upper bound, all replicas)."""
    up = case.replicas[stage - 1] if stage > 0 else 0
    down = case.replicas[stage + 1] if stage + 1 < len(case.replicas) else 0
    return list(range(up + down))
