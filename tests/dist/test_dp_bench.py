"""`approxdist bench dp` on 2 gloo ranks at a tiny size: every variant runs, rows have their keys."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from approxdist.benchmarks.ddp_baselines import torch_powersgd
from approxdist.benchmarks.dp import CLASSES, INPUT_SHAPE, DPBenchPlan, measure_rank, summarize
from approxdist.cli.bench_dp import table
from approxdist.config.schema import ModelConfig
from approxdist.launch.context import DistContext
from approxdist.launch.spawn import run_on_ranks
from approxdist.models import build_model
from approxdist.models.bench_inputs import bench_input
from tests.helpers.tiny_mlp import net, sgd_steps

KEYS = {"engine", "codec", "link", "median_step_s", "ratio_vs_ddp", "hidden_comm_fraction",
        "hidden_comm_fraction_wall", "comm_only_s", "blocked_s", "interference_s",
        "cpu_over_local_s"}


PLAN = DPBenchPlan(model="mlp", hidden=32, batch_size=8, codecs=("fp32", "bf16+ef"),
                  link="bw=1gbit", rounds=2, steps=2, warmup=1)
#: compressors against DDP in fp16 and with torch's powerSGD_hook, on the emulated link
COMPRESSED = DPBenchPlan(model="mlp", hidden=32, batch_size=8,
                         codecs=("powersgd:2", "topk:0.1"), link="bw=1gbit",
                         ddp_codecs=("fp16", "powersgd:2"), rounds=1, steps=2, warmup=2,
                         engine_options={"algorithm": "ring"})


#: DDP's bucket cap for the baseline check: about 100 bytes, so the tiny MLP gets 3 buckets
TINY_BUCKET_MB = 1e-4
BASELINE_STEPS = 5


def _serial_powersgd(state, bucket):  # type: ignore[no-untyped-def]  # annotated below
    """torch's hook on the default group, each bucket finished before backward goes on:
    no two collectives are ever in flight, so no order can differ between the ranks."""
    fut = powersgd.powerSGD_hook(state, bucket)
    fut.wait()
    return fut


# DDP checks a hook's annotations at run time, which `from __future__ import annotations`
# turns into strings
_serial_powersgd.__annotations__ = {"state": Any, "bucket": dist.GradBucket,
                                    "return": torch.futures.Future[torch.Tensor]}


def _baseline(ctx: DistContext) -> dict[str, Any]:
    """DDP + torch's powerSGD_hook as `bench dp` runs it, with no link and a bucket per
    parameter, against the same hook run serially on one group."""
    ours = net()
    ddp = nn.parallel.DistributedDataParallel(ours, bucket_cap_mb=TINY_BUCKET_MB)
    baseline = torch_powersgd(ddp, ctx, 2)
    sgd_steps(ddp, torch.optim.SGD(ours.parameters(), lr=0.1), ctx.rank, range(BASELINE_STEPS))
    lanes = len(baseline.lanes)  # one per bucket DDP made
    baseline.close()
    serial = net()
    ddp_s = nn.parallel.DistributedDataParallel(serial, bucket_cap_mb=TINY_BUCKET_MB)
    ddp_s.register_comm_hook(powersgd.PowerSGDState(None, matrix_approximation_rank=2,
                                                    start_powerSGD_iter=2), _serial_powersgd)
    sgd_steps(ddp_s, torch.optim.SGD(serial.parameters(), lr=0.1), ctx.rank,
              range(BASELINE_STEPS))
    return {"lanes": lanes, "ours": ours.state_dict(), "serial": serial.state_dict()}


def _both(ctx: DistContext) -> list[dict[str, Any]]:
    return [measure_rank(ctx, PLAN), measure_rank(ctx, COMPRESSED), _baseline(ctx)]


@pytest.fixture(scope="module")
def two_ranks() -> list[list[dict[str, Any]]]:
    return run_on_ranks(_both, 2)


def test_compressors_run_against_ddp_with_torchs_powersgd_hook(
        two_ranks: list[list[dict[str, Any]]]) -> None:
    rows = summarize([r[1] for r in two_ranks], COMPRESSED)
    assert [(r["engine"], r["codec"]) for r in rows] == [
        ("local", "-"), ("ddp", "fp32"), ("ddp", "fp16"), ("ddp", "powersgd:2"),
        ("approxdist", "powersgd:2"), ("approxdist", "topk:0.1")]
    assert all(r["median_step_s"] > 0 for r in rows)
    ours = {r["codec"]: r["bytes_per_step_rank0"] for r in rows[4:]}
    # PowerSGD rank 2 and 10 % top-k send far less than the model's fp32 gradient
    inputs = bench_input("mlp", INPUT_SHAPE, CLASSES)
    model = build_model(ModelConfig(name="mlp", hidden=32, depth=3), inputs.shape,
                        inputs.classes)
    fp32_bytes = 4 * sum(p.numel() for p in model.parameters())
    assert 0 < ours["powersgd:2"] < fp32_bytes / 4 and 0 < ours["topk:0.1"] < fp32_bytes / 4


def test_variants_run_and_exposed_communication_is_measured(
        two_ranks: list[list[dict[str, Any]]]) -> None:
    plan = PLAN
    per_rank = [r[0] for r in two_ranks]
    for r in per_rank:
        assert set(r["blocked"]) == {"approxdist:fp32", "approxdist:bf16+ef"}
        assert all(len(v) == plan.rounds * plan.steps and min(v) >= 0.0
                   for v in r["blocked"].values())
    rows = summarize(per_rank, plan)
    assert [r["engine"] for r in rows] == ["local", "ddp", "approxdist", "approxdist"]
    for r in rows[2:]:
        assert set(r) >= KEYS
        assert 0.0 <= r["hidden_comm_fraction"] <= 1.0 and r["comm_only_s"] > 0
        assert r["bytes_per_step_rank0"] > 0
    assert "wall est" in table(rows)


def test_the_powersgd_baseline_runs_with_buckets_overlapping_and_no_link(
        two_ranks: list[list[dict[str, Any]]]) -> None:
    """The baseline (a process group per bucket) equals torch's hook run one bucket at a
    time, bit for bit: the same hook, the same sums (2 ranks: a + b either way)."""
    for out in (r[2] for r in two_ranks):
        assert out["lanes"] >= 2  # several buckets in flight, each on its own lane
        for key, value in out["serial"].items():
            assert torch.equal(out["ours"][key], value), key
    assert all(torch.equal(two_ranks[0][2]["ours"][k], two_ranks[1][2]["ours"][k])
               for k in two_ranks[0][2]["ours"])
