"""`approxdist bench dp` on 2 gloo ranks at a tiny size: every variant runs, rows have their keys."""

from __future__ import annotations

from approxdist.cli.bench_dp import table
from approxdist.benchmarks.dp import DPBenchPlan, measure_rank, summarize
from approxdist.launch.spawn import run_on_ranks

KEYS = {"engine", "codec", "link", "median_step_s", "ratio_vs_ddp", "hidden_comm_fraction",
        "hidden_comm_fraction_wall", "comm_only_s", "blocked_s", "interference_s"}


def test_variants_run_and_exposed_communication_is_measured() -> None:
    plan = DPBenchPlan(model="mlp", hidden=32, batch_size=8, codecs=("fp32", "bf16+ef"),
                       link="bw=1gbit", rounds=2, steps=2, warmup=1)
    per_rank = run_on_ranks(measure_rank, 2, plan)
    for r in per_rank:
        assert set(r["blocked"]) == {"approxdist:fp32", "approxdist:bf16+ef"}
        assert all(len(v) == plan.rounds * plan.steps and min(v) >= 0.0
                   for v in r["blocked"].values())
    rows = summarize(per_rank, plan)
    assert [r["engine"] for r in rows] == ["local", "ddp", "approxdist", "approxdist"]
    for r in rows[2:]:
        assert KEYS <= set(r)
        assert 0.0 <= r["hidden_comm_fraction"] <= 1.0 and r["comm_only_s"] > 0
        assert r["bytes_per_step_rank0"] > 0
    assert "wall est" in table(rows)
