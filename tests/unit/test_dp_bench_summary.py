"""`approxdist bench dp`'s summary: slowest-rank step times, exposed communication, hidden share."""

from __future__ import annotations

import pytest

from approxdist.benchmarks.dp import DPBenchPlan, summarize


def _rank(step: list[float], blocked: list[float],
          cpu: list[float] | None = None) -> dict[str, object]:
    return {"times": {"local": [1.0, 1.0, 1.0], "ddp": [1.2, 1.2, 1.2], "approxdist:fp32": step},
            "blocked": {"approxdist:fp32": blocked},
            "comm": {"fp32": [0.10, 0.10, 0.10]}, "bytes": {"fp32": 1000},
            "cpu": {"local": [1.0, 1.0, 1.0], "ddp": [1.3, 1.3, 1.3],
                    "approxdist:fp32": cpu or [1.0, 1.0, 1.0]}}


def test_hidden_share_comes_from_the_last_ranks_wait_not_from_skew() -> None:
    """Rank 0 finishes backward early and waits 50 ms for rank 1 (skew); rank 1, the last
    to finish, waits 10 ms for communication backward did not hide: 90 % hidden."""
    per_rank = [_rank([1.08, 1.10, 1.09], [0.06, 0.05, 0.07]),
                _rank([1.07, 1.10, 1.08], [0.01, 0.01, 0.02])]
    rows = {r["engine"]: r for r in summarize(per_rank, DPBenchPlan())}  # type: ignore[arg-type]
    ours = rows["approxdist"]
    assert ours["median_step_s"] == pytest.approx(1.09)   # slowest rank per step: 1.08, 1.10, 1.09
    assert ours["blocked_s"] == pytest.approx(0.01)        # least-waiting rank per step: .01 .01 .02
    assert ours["hidden_comm_fraction"] == pytest.approx(0.9)
    # the wall estimate charges every slowdown to communication: (1.0 + 0.1 - 1.09) / 0.1
    assert ours["hidden_comm_fraction_wall"] == pytest.approx(0.1)
    assert ours["interference_s"] == pytest.approx(1.09 - 1.0 - 0.01)
    assert ours["ratio_vs_ddp"] == pytest.approx(1.09 / 1.2)
    assert rows["local"]["hidden_comm_fraction"] is None


def test_shares_are_clamped_to_0_and_1() -> None:
    per_rank = [_rank([1.5, 1.5, 1.5], [0.3, 0.3, 0.3])] * 2
    ours = summarize(per_rank, DPBenchPlan())[-1]  # type: ignore[arg-type]
    assert ours["hidden_comm_fraction"] == 0.0 and ours["hidden_comm_fraction_wall"] == 0.0


def test_bench_dp_gil_switch_option_reaches_the_plan_and_rejects_negatives() -> None:
    from approxdist.cli.bench_dp import plan_from
    from approxdist.cli.main import build_parser
    from approxdist.errors import ConfigError

    parser = build_parser()
    plan = plan_from(parser.parse_args(["bench", "dp", "--gil-switch-ms", "0"]))
    assert plan.engine_options["gil_switch_ms"] is None  # 0: leave Python's interval
    plan = plan_from(parser.parse_args(["bench", "dp", "--gil-switch-ms", "0.25"]))
    assert plan.engine_options["gil_switch_ms"] == 0.25
    with pytest.raises(ConfigError, match="--gil-switch-ms -1.0 must be >= 0"):
        plan_from(parser.parse_args(["bench", "dp", "--gil-switch-ms", "-1"]))


def test_paired_ratio_pairs_steps_of_the_same_round() -> None:
    """Per step ours / DDP is 0.5, 0.9, 2.0: the paired ratio is their median, 0.9, while
    the ratio of the two medians (1.8 / 1.0) mixes steps from different moments."""
    rank = _rank([0.5, 1.8, 1.9], [0.0, 0.0, 0.0])
    rank["times"]["ddp"] = [1.0, 2.0, 0.95]  # type: ignore[index]
    ours = summarize([rank, rank], DPBenchPlan())[-1]  # type: ignore[arg-type]
    assert ours["paired_ratio_vs_ddp"] == pytest.approx(0.9)
    assert ours["ratio_vs_ddp"] == pytest.approx(1.8)


def test_bench_dp_takes_compressors_and_ddp_rows_and_refuses_bad_ones_in_one_line() -> None:
    from approxdist.cli.bench_dp import plan_from
    from approxdist.cli.main import build_parser
    from approxdist.errors import ApproxDistError

    parser = build_parser()
    plan = plan_from(parser.parse_args(["bench", "dp", "--codec", "powersgd:2,TopK:0.01,bf16+ef",
                                        "--ddp-codec", "fp32,fp16,powersgd:2"]))
    assert plan.codecs == ("powersgd:2", "topk:0.01", "bf16+ef")
    assert (plan.ddp_codec, plan.ddp_codecs) == ("fp32", ("fp16", "powersgd:2"))
    bad = {("--codec", "topk:2"): "topk ratio '2'", ("--codec", "qsgd:1"): "qsgd levels '1'",
           ("--codec", "powersgd:0"): "powersgd rank '0'",
           ("--codec", "topk:0.1+ef"): "keeps its own residual",
           ("--ddp-codec", "fp32,topk:0.1"): "DDP runs fp32, fp16, powersgd:<r>",
           ("--ddp-codec", "powersgd:x"): "powersgd rank 'x'"}
    for (flag, value), words in bad.items():
        with pytest.raises(ApproxDistError, match=words) as err:
            plan_from(parser.parse_args(["bench", "dp", flag, value]))
        assert "\n" not in str(err.value)
    with pytest.raises(ApproxDistError, match="'brb' only sums; use --algorithm ring or auto"):
        plan_from(parser.parse_args(["bench", "dp", "--codec", "signsgd", "--algorithm", "brb"]))


def test_extra_ddp_rows_are_compared_with_the_reference_ddp() -> None:
    rank = _rank([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    rank["times"]["ddp:powersgd:2"] = [0.6, 0.6, 0.6]  # type: ignore[index]
    rows = summarize([rank, rank], DPBenchPlan(ddp_codecs=("powersgd:2",)))  # type: ignore[arg-type]
    extra = [r for r in rows if r["engine"] == "ddp" and r["codec"] == "powersgd:2"]
    assert len(extra) == 1 and extra[0]["ratio_vs_ddp"] == pytest.approx(0.5)


def test_cpu_over_local_is_the_median_of_the_ranks_mean_cpu_a_step_less_locals() -> None:
    """Rank 0's communication used 40-60 ms of CPU a step, rank 1's 20-40 ms: the ranks'
    mean per step is 30, 50, 40 ms, its median 40 ms over the local step's 1 s."""
    per_rank = [_rank([1.09] * 3, [0.01] * 3, cpu=[1.04, 1.06, 1.05]),
                _rank([1.09] * 3, [0.01] * 3, cpu=[1.02, 1.04, 1.03])]
    ours = summarize(per_rank, DPBenchPlan())[-1]  # type: ignore[arg-type]
    assert ours["cpu_over_local_s"] == pytest.approx(0.04)
