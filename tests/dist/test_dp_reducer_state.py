"""Error-feedback state in checkpoints, the DDP comm hook, and the Trainer on our engine.

* residuals of a lossy codec are saved by `state_dict()` and restored by
  `load_state_dict()`: a restored engine continues exactly like the original;
* through the Trainer, a resumed run with error feedback equals an uninterrupted one
  (every rank's residuals travel in rank 0's checkpoint); metrics count bytes per link;
* our DDP comm hook with fp32 equals plain DDP; with bf16 (everywhere, or by per-parameter
  rules) one step lies within the all-reduce's documented bound of plain DDP's, and each
  run of parameters travels in its own codec.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from approxdist.data_parallel import DataParallel
from approxdist.data_parallel.ddp_hook import register_hook
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from tests.helpers.runs import full_and_resumed
from tests.helpers.tiny_mlp import batch, net, sgd_steps

LR = 0.1


def _ef_round_trip(ctx: DistContext) -> dict[str, Any]:
    kw = {"codec": "bits:s1e8m3", "error_feedback": True, "algorithm": "ring"}
    a = net()
    dp_a = DataParallel(a, ctx=ctx, **kw)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
    sgd_steps(dp_a, opt_a, ctx.rank, range(3))
    saved = dp_a.state_dict()
    b = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4))
    dp_b = DataParallel(b, ctx=ctx, broadcast=False, **kw)
    dp_b.load_state_dict(saved)
    fresh = DataParallel(net(), ctx=ctx, **kw)  # same weights, no residuals
    fresh.module.load_state_dict(a.state_dict())
    for dp, m in ((dp_a, a), (dp_b, b), (fresh, fresh.module)):
        sgd_steps(dp, torch.optim.SGD(m.parameters(), lr=0.1), ctx.rank, range(3, 5))
        dp.close()
    return {"residual_norm": sum(float(r.norm()) for r in saved["_extra_state"]["residuals"].values()),
            "a": a.state_dict(), "b": b.state_dict(), "fresh": fresh.module.state_dict()}


def _ddp_vs_hook(ctx: DistContext) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rules = {"hook fp32": [], "hook bf16": ["*=bf16"], "hook rules": ["*.bias=fp32", "*=bf16"]}
    for name in ("ddp", *rules):
        for steps in (1, 3):
            m = net()
            ddp = nn.parallel.DistributedDataParallel(m, bucket_cap_mb=0.001)
            state = register_hook(ddp, ctx, algorithm="ring",
                                  codec_rules=rules[name]) if "hook" in name else None
            sgd_steps(ddp, torch.optim.SGD(m.parameters(), lr=LR, momentum=0.9), ctx.rank,
                      range(steps))
            key = name if steps == 3 else f"{name}:1"
            out[key] = m.state_dict()
            if state is not None:
                out[key + ":bytes"] = state.bytes_sent()
                state.close()
    return out


def _both(ctx: DistContext) -> dict[str, Any]:
    return {"ef": _ef_round_trip(ctx), "hook": _ddp_vs_hook(ctx)}


@pytest.fixture(scope="module")
def two_ranks() -> list[dict[str, Any]]:
    """One 2-rank run for the two tests below (process start-up dominates their cost)."""
    return run_on_ranks(_both, 2)


def test_error_feedback_residuals_round_trip_through_state_dict(two_ranks: list[dict[str, Any]]
                                                                 ) -> None:
    ranks = [r["ef"] for r in two_ranks]
    assert ranks[0]["residual_norm"] > 0  # the lossy codec left something to feed back
    for k, v in ranks[0]["a"].items():
        assert torch.equal(ranks[0]["b"][k], v), k
        assert torch.equal(ranks[1]["b"][k], v), k
    assert any(not torch.equal(ranks[0]["fresh"][k], v) for k, v in ranks[0]["a"].items())


def _first_step_bound(name: str) -> dict[str, torch.Tensor]:
    """|hook - DDP| allowed after one SGD step (the momentum buffer is the gradient itself,
    so the step moves each weight by lr x the averaged gradient): lr x (N + 2) u
    sum_r |g_r| / N for a parameter sent in bf16 (the all-reduce's documented bound,
    u = 2^-8, N = 2 ranks), nothing for one sent in fp32, plus fp32 rounding."""
    model = net()
    grads = []
    for rank in range(2):
        model.zero_grad()
        x, y = batch(rank, 0)
        F.cross_entropy(model(x), y).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    in_fp32 = name == "hook rules"  # its rule "*.bias=fp32"
    return {n: 1e-6 + (0.0 if in_fp32 and n.endswith(".bias") else
                       LR * 4 * 2.0 ** -8 * (grads[0][n].abs() + grads[1][n].abs()) / 2)
            for n in grads[0]}


def test_ddp_comm_hook_fp32_equals_plain_ddp(two_ranks: list[dict[str, Any]]) -> None:
    ranks = [r["hook"] for r in two_ranks]
    for k, v in ranks[0]["ddp"].items():
        torch.testing.assert_close(ranks[0]["hook fp32"][k], v, atol=1e-6, rtol=0, msg=k)
        for lossy in ("hook bf16", "hook rules"):  # 3 steps: the ranks agree bit for bit
            assert torch.equal(ranks[1][lossy][k], ranks[0][lossy][k]), k
    for lossy in ("hook bf16", "hook rules"):  # 1 step: within the all-reduce's bound
        bound = _first_step_bound(lossy)
        for k, v in ranks[0]["ddp:1"].items():
            err = (ranks[0][f"{lossy}:1"][k] - v).abs()
            assert bool((err <= bound[k]).all()), (lossy, k, float(err.max()))
        assert any(not torch.equal(ranks[0][f"{lossy}:1"][k], v)  # bf16 did change a value
                   for k, v in ranks[0]["ddp:1"].items())
    assert 0 < ranks[0]["hook bf16:bytes"] < 0.6 * ranks[0]["hook fp32:bytes"]
    # the biases (36 of 486 values) travel in fp32, the weights in bf16
    assert ranks[0]["hook bf16:bytes"] < ranks[0]["hook rules:bytes"] < ranks[0]["hook fp32:bytes"]
    assert not all(torch.equal(ranks[0]["hook rules"][k], ranks[0]["hook bf16"][k])
                   for k in ranks[0]["ddp"])


SECTIONS: dict[str, dict[str, Any]] = {
    "train": {"progress": False, "seed": 3, "world_size": 2},
    "data": {"dataset": "synthetic", "synthetic_shape": [12], "synthetic_samples": 64,
             "batch_size": 16, "augment": False},
    "model": {"name": "mlp", "hidden": 32, "depth": 2},
    "optim": {"lr": 0.05, "schedule": "step", "step_size": 5, "gamma": 0.5},
    "dp": {"early_forward": True, "bucket_mb": 0.002},
    "wire": {"grad": {"codec": "bf16", "error_feedback": True}},
}


def test_trainer_resume_with_error_feedback_is_bit_exact(tmp_path: Path) -> None:
    """1 epoch, then a resume that trains epochs 2 and 3 only, equals 3 straight."""
    ranks = run_on_ranks(full_and_resumed, 2, SECTIONS, str(tmp_path))
    for k, v in ranks[0][0].items():
        assert torch.equal(ranks[0][1][k], v), k
        assert torch.equal(ranks[1][1][k], v), k
    ckpt = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=True)
    assert len(ckpt["dp"]["ranks"]) == 2 and ckpt["dp"]["ranks"][1]["residuals"]
    epoch = [json.loads(s) for s in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()
             if '"epoch"' in s and '"test_accuracy"' in s][-1]
    assert set(epoch["bytes_sent"]) == {"0->1", "1->0"} and epoch["bytes_sent"]["0->1"] > 0
