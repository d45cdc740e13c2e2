"""`approxdist bench pipeline`: both engines run the same tiny case; rows, ratios and checks."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from approxdist.bench.timing import Timing
from approxdist.benchmarks.pipeline import BenchCase, measure_rank
from approxdist.cli import bench_pipeline
from approxdist.errors import ConfigError
from approxdist.launch.spawn import run_on_ranks
from approxdist.models.bench_inputs import bench_input

KEYS = {"engine", "schedule", "stages", "microbatches", "samples_per_s", "ratio_vs_torch",
        "bubble_measured", "bubble_theory"}


def test_both_engines_run_the_same_case_and_rows_have_the_json_keys(tmp_path: Path) -> None:
    """Every schedule torch has, ZB-V's two stages per rank included: the same warm-up losses
    (the forward of step 1, the gradients and SGD step through step 2's)."""
    cases = [BenchCase("mlp", (16,), 2, m, s, batch_size=8, hidden=16, depth=3)
             for s, m in (("gpipe", 4), ("1f1b", 2), ("zbh1", 2), ("zbv", 4))]
    per_rank = run_on_ranks(measure_rank, 2, cases, Timing(rounds=1, steps=1, warmup=2))
    rows = bench_pipeline.summarize(cases, per_rank, steps=1)
    assert len(rows) == 8 and all(set(r) >= KEYS for r in rows)
    for case, (ours, torch_row) in zip(cases, zip(rows[::2], rows[1::2])):
        assert len(ours["warmup_losses"]) == 2
        assert ours["warmup_losses"] == pytest.approx(torch_row["warmup_losses"], rel=1e-5)
        assert ours["warmup_losses"][1] != ours["warmup_losses"][0]  # the SGD step moved it
        assert (ours["engine"], torch_row["engine"]) == ("approxdist", "torch")
        assert ours["ratio_vs_torch"] == pytest.approx(
            ours["samples_per_s"] / torch_row["samples_per_s"])
        assert torch_row["ratio_vs_torch"] == 1.0 and torch_row["bubble_measured"] is None
        assert torch_row["paired_ratio"] == 1.0 and ours["paired_ratio"] > 0
        assert 0.0 <= ours["bubble_measured"] < 1.0
        slots = {"zbh1": 3, "zbv": 6}.get(case.schedule, 1) * case.microbatches
        assert ours["bubble_theory"] == pytest.approx(1 / (slots + 1))  # (P-1)/(M+P-1), ZB's
    out = tmp_path / "rows.json"
    out.write_text(json.dumps(rows))
    assert "approxdist" in bench_pipeline.table(json.loads(out.read_text()))


@pytest.mark.parametrize(("flags", "message"), [
    ({"microbatches": "4,x"}, "not a comma list of integers"),
    ({"microbatches": "80"}, "--microbatches 80 exceeds --batch-size 64"),
    ({"schedule": "zb"}, "pipeline.schedule = 'zb' is not one of"),
    ({"stages": 1}, "needs 2 or more stages"),
    ({"rounds": 0}, "--rounds 0 must be >= 1"),
])
def test_bad_bench_input_is_refused_before_any_rank_starts(flags: dict[str, object],
                                                           message: str) -> None:
    args = {"model": "mlp", "stages": 2, "microbatches": "4", "schedule": "gpipe",
            "batch_size": 64, "split": "", "balance": "", "link": "", "fwd_codec": "fp32",
            "bwd_codec": "fp32", "fuse_accumulation": "auto", "rounds": 5, "steps": 10}
    args.update(flags)
    with pytest.raises(ConfigError, match=message):
        bench_pipeline.plan_cases(argparse.Namespace(**args))


def test_hybrid_bench_runs_both_compositions_on_a_2x2_grid(tmp_path: Path) -> None:
    """`bench hybrid`: ours and torch pipelining + replicate on 4 ranks; the JSON keys of the
    issue, the replica all-reduce measured alone and blocked, every rank the same rounds."""
    from approxdist.benchmarks.hybrid import measure_rank as hybrid_rank
    from approxdist.cli import bench_hybrid

    cases = [BenchCase("mlp", (16,), 2, 2, s, batch_size=8, hidden=16, depth=2, replicas=2)
             for s in ("gpipe", "1f1b")]
    per_rank = run_on_ranks(hybrid_rank, 4, cases, Timing(rounds=1, steps=2, warmup=1),
                            timeout_s=180)
    rows = bench_pipeline.summarize(cases, per_rank, steps=2, extra=bench_hybrid.hidden)
    assert len(rows) == 4
    for ours, torch_row in zip(rows[::2], rows[1::2]):
        assert {"engine", "schedule", "stages", "replicas", "microbatches", "samples_per_s",
                "ratio_vs_torch"} <= set(ours) and ours["replicas"] == 2
        assert (ours["engine"], torch_row["engine"]) == ("approxdist", "torch")
        assert [s["stage"] for s in ours["by_stage"]] == [0, 1]
        assert all(s["comm_only_s"] > 0 and s["blocked_s"] >= 0 for s in ours["by_stage"])
        assert 0.0 <= ours["hidden_comm_fraction"] <= 1.0 and "hidden_comm_fraction" not in torch_row
    assert all(len(r[0]["rounds"]["torch"]) == 1 for r in per_rank)
    assert "approxdist" in bench_hybrid.table(rows)


def test_a_transformer_runs_through_both_engines() -> None:
    """`bench pipeline --model gpt-tiny`: byte tokens in, a next-token loss per position,
    on our executor and torch.distributed.pipelining alike."""
    inputs = bench_input("gpt-tiny", ())
    case = BenchCase("gpt-tiny", (16,), 2, 2, "1f1b", batch_size=4, classes=inputs.classes,
                     tokens=True)
    per_rank = run_on_ranks(measure_rank, 2, [case], Timing(rounds=1, steps=1, warmup=1))
    rows = bench_pipeline.summarize([case], per_rank, steps=1)
    assert [r["engine"] for r in rows] == ["approxdist", "torch"]
    assert all(r["samples_per_s"] > 0 for r in rows)
