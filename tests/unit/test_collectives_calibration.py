"""`auto`'s choice: the alpha-beta model, calibration fitting and files, bench helpers."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from approxdist.bench.stats import p10
from approxdist.benchmarks.allreduce import summarize, table
from approxdist.cli.bench_allreduce import combos_for, parse_algorithms, parse_sizes
from approxdist.comm.collectives import Calibration, Measurement, fit, get_algorithm
from approxdist.comm.collectives.auto import Auto
from approxdist.comm.collectives.calibration import fit_model
from approxdist.comm.collectives.model import DEFAULT, AlphaBeta, codec_work, cost_terms, predict
from approxdist.comm.netem import parse_link
from approxdist.errors import ConfigError
from tests.helpers.sim_world import simulate

M = 1 << 20


def test_cost_terms_match_seed_001_table() -> None:
    assert cost_terms("brd", 8, M) == (3, 3 * M)
    assert cost_terms("brb", 8, M) == (6, 6 * M)
    assert cost_terms("vhd", 8, M) == (6, 2 * M * 7 / 8)
    assert cost_terms("ring", 8, M) == (14, 2 * M * 7 / 8)
    assert cost_terms("brd", 6, M) == (2 + 2, 2 * M + 2 * M)  # folded: two extra steps
    assert cost_terms("vhd", 1, M) == (0, 0)


def test_default_model_picks_brd_small_and_bandwidth_optimal_large() -> None:
    auto = get_algorithm("auto")
    assert isinstance(auto, Auto)
    assert auto.choose(4096, 4) == "brd"
    assert auto.choose(64 * M, 4) in ("vhd", "ring")
    assert auto.choose(64 * M, 3) in ("vhd", "ring")
    # a slow link makes bytes dominate sooner; compression makes them matter later
    slow = Auto(get_algorithm, link=parse_link("bw=10mbit"))
    assert slow.choose(256 * 1024, 4) in ("vhd", "ring")
    assert predict("vhd", 4, M, DEFAULT.with_link(parse_link("bw=1gbit"))) > predict("vhd", 4, M)
    link = parse_link("bw=1gbit,lat=1ms")
    assert predict("vhd", 4, M, link=link) == pytest.approx(
        predict("vhd", 4, M, DEFAULT.with_link(link)))


def test_native_is_a_candidate_only_for_exact_fp32() -> None:
    """gloo's C++ ring costs less per byte: exact fp32 calls pick it for large messages."""
    exact = get_algorithm("auto", native_ok=True)
    lossy = get_algorithm("auto", native_ok=False)
    assert isinstance(exact, Auto) and isinstance(lossy, Auto)
    assert exact.choose(4096, 2) == "brd" and exact.choose(4096, 4) == "brd"
    assert exact.choose(64 * M, 2) == "native" and exact.choose(64 * M, 4) == "native"
    assert lossy.choose(64 * M, 2) != "native" and "native" not in lossy.candidates
    assert predict("native", 4, M) < predict("ring", 4, M)


def test_codec_work_steers_lossy_messages_to_ring() -> None:
    """brd shares and adds the whole vector; ring encodes each chunk once: on 2 ranks
    a large compressed message goes to ring, a small one still to brd (fewest steps)."""
    assert codec_work("ring", 2, 100) == 250 and codec_work("brd", 2, 100) == 300
    assert codec_work("brd", 3, 100) == 600 and codec_work("native", 4, 100) == 0
    lossy = get_algorithm("auto", wire_fraction=0.5, encodes=True)
    raw = get_algorithm("auto", wire_fraction=0.5)
    assert isinstance(lossy, Auto) and isinstance(raw, Auto)
    assert lossy.choose(16 * M, 2) == "ring" and lossy.choose(4096, 2) == "brd"
    assert raw.choose(16 * M, 2) == "brd"
    assert predict("ring", 2, M, codec_values=M / 4) > predict("ring", 2, M)


def test_allreduce_lets_auto_pick_native_only_for_exact_fp32() -> None:
    from approxdist.comm.collectives import AllReduce
    from tests.helpers.sim_world import SimWorld

    world = SimWorld(2)
    for codec, channel, ok in (("fp32", None, True), ("bf16", None, False),
                               ("fp32", "ber:1e-6@5", False)):
        auto = AllReduce(world.comm(0), "auto", codec, channel).algorithm
        assert isinstance(auto, Auto) and ("native" in auto.candidates) == ok
        assert auto.encodes == (not ok)


def test_fit_recovers_alpha_beta() -> None:
    truth = AlphaBeta(5e-4, 2e-9)
    sizes = [4096, 65536, M, 16 * M]
    points = [Measurement("vhd", s, truth.time(*cost_terms("vhd", 4, s))) for s in sizes]
    model = fit_model("vhd", 4, points)
    assert model.alpha_s == pytest.approx(truth.alpha_s, rel=1e-6)
    assert model.beta_s_per_byte == pytest.approx(truth.beta_s_per_byte, rel=1e-6)


def _measured() -> list[Measurement]:
    small, large = AlphaBeta(1e-3, 3e-9), AlphaBeta(2e-3, 1e-9)
    rows = []
    for s in (4096, 65536, M, 16 * M):
        rows.append(Measurement("brd", s, small.time(*cost_terms("brd", 4, s))))
        rows.append(Measurement("vhd", s, large.time(*cost_terms("vhd", 4, s))))
        rows.append(Measurement("auto", s, 1.0))  # never a candidate
    return rows


def test_thresholds_follow_the_measured_winners(tmp_path: Path) -> None:
    cal = fit(_measured(), 4, link="none", codec="fp32")
    assert cal.thresholds[-1] == (None, "vhd")
    assert [a for _, a in cal.thresholds] == ["brd", "vhd"]
    cut = cal.thresholds[0][0]
    assert cut is not None and 4096 <= cut < 16 * M
    assert cal.choose(4096) == "brd" and cal.choose(16 * M) == "vhd"
    path = cal.save(tmp_path / "cal.json")
    assert json.loads(path.read_text())["thresholds"][0]["algorithm"] == "brd"
    again = Calibration.load(path)
    assert again.thresholds == cal.thresholds and again.models == cal.models
    auto = get_algorithm("auto", calibration=path)
    assert isinstance(auto, Auto) and auto.choose(16 * M, 4) == "vhd"


def test_calibrated_native_falls_back_when_not_allowed() -> None:
    """A calibration that names native serves lossy calls with their fastest measured peer."""
    rows = [Measurement("native", 4096, 3e-3), Measurement("brb", 4096, 1e-3),
            Measurement("native", 16 * M, 20e-3), Measurement("ring", 16 * M, 24e-3),
            Measurement("vhd", 16 * M, 22e-3), Measurement("brb", 16 * M, 40e-3)]
    cal = fit(rows, 2)
    assert cal.choose(16 * M) == "native"
    assert cal.choose(16 * M, ("ring", "vhd", "brb", "brd")) == "vhd"
    assert cal.choose(64 * M, ("ring", "vhd")) == "vhd"  # nearest measured size: 16M
    assert cal.choose(4096, ("ring", "vhd", "brb", "brd")) == "brb"
    bare = Calibration(2, ((None, "native"),))
    with pytest.raises(ConfigError, match="no measurement of ring"):
        bare.choose(M, ("ring",))


def test_winner_by_median_not_by_the_ratio_to_a_noisy_native() -> None:
    """Round by round against native brd looked faster (native's own spread), but brb's
    median is lower: brb wins, with or without paired ratios (as seen at 4 KiB on 4 ranks)."""
    rows = [Measurement("brb", 4096, 1.0e-3, 0.9), Measurement("brd", 4096, 1.1e-3, 0.7),
            Measurement("native", 4096, 1.2e-3, 1.0)]
    assert fit(rows, 4).thresholds == ((None, "brb"),)
    plain = [Measurement(m.algorithm, m.size_bytes, m.median_s) for m in rows]
    assert fit(plain, 4).thresholds == ((None, "brb"),)


def test_calibration_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read calibration file"):
        Calibration.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1}')
    with pytest.raises(ConfigError, match="malformed.*--calibrate"):
        Calibration.load(bad)
    cal = fit(_measured(), 4)
    with pytest.raises(ConfigError, match="measured on 4 ranks but this run has 3"):
        simulate("auto", [torch.ones(8)] * 3, calibration=cal)


def test_auto_with_calibration_runs_the_chosen_algorithm() -> None:
    cal = Calibration(2, ((100, "brb"), (None, "ring")))
    for n in (10, 1000):
        outs = simulate("auto", [torch.ones(n), torch.ones(n)], calibration=cal)
        assert torch.equal(outs[0], torch.full((n,), 2.0))


def test_bench_argument_parsing() -> None:
    assert parse_sizes("4K,64K,1M,16M,64M") == (4096, 65536, M, 16 * M, 64 * M)
    assert parse_sizes("12") == (12,)
    with pytest.raises(ConfigError, match="multiple of 4"):
        parse_sizes("6")
    with pytest.raises(ConfigError, match="not <number>"):
        parse_sizes("4X")
    assert parse_algorithms("all")[0] == "native"
    with pytest.raises(Exception, match="valid: .*vhd"):
        parse_algorithms("ring,bogus")
    assert combos_for(["native", "ring"], ["fp32", "bf16"]) == (
        ("native", "fp32"), ("ring", "fp32"), ("ring", "bf16"))


def test_summary_rows_use_the_slowest_rank_and_native_ratio() -> None:
    rank0 = {("native", "fp32", 1000): [1.0, 2.0, 3.0], ("ring", "fp32", 1000): [1.0, 1.0, 1.0]}
    rank1 = {("native", "fp32", 1000): [2.0, 1.0, 3.0], ("ring", "fp32", 1000): [0.5, 4.0, 0.5]}
    rows = {r.algorithm: r for r in summarize([rank0, rank1], 2, None)}
    assert rows["native"].median_s == 2.0  # max per repetition: 2, 2, 3
    assert rows["ring"].median_s == 1.0    # 1, 4, 1
    assert rows["ring"].ratio_vs_native == 0.5
    assert rows["ring"].extra["paired_ratio"] == 0.5  # median of 1/2, 4/2, 1/3
    assert rows["ring"].busbw_gbps == pytest.approx(1000 / 1.0 * 1.0 / 1e9)
    assert set(rows["ring"].as_json()) >= {"algorithm", "codec", "size_bytes", "world_size",
                                           "median_s", "p10_s", "busbw_gbps",
                                           "ratio_vs_native"}
    assert "ring" in table(list(rows.values()))
    assert p10([5.0, 1.0, 3.0]) == 1.0 and p10(list(range(1, 21))) == 2


def test_auto_calibration_forecasts_a_size_from_a_line_through_the_last_two() -> None:
    """A fixed cost dominates the small sizes: scaling 1 MiB's time by 16 would forecast
    16 MiB at 16x, the line through 64 KiB and 1 MiB at what the bytes add; the size then
    costs its warm-up and the rounds `_rounds` gives it."""
    from approxdist.comm.collectives import autocal

    def size_rows(size: int, seconds: float) -> list[Measurement]:
        return [Measurement(a, size, seconds / len(autocal.CANDIDATES))
                for a in autocal.CANDIDATES]

    out = size_rows(64 << 10, 0.020) + size_rows(1 << 20, 0.030)
    got = autocal._forecast(out, (64 << 10, 1 << 20), 16 << 20)
    per_byte = (0.030 - 0.020) / ((1 << 20) - (64 << 10))
    one = 0.030 + per_byte * 15 * (1 << 20)
    assert got == pytest.approx(one * (1 + autocal._rounds(one)))
    assert got < (autocal.ROUNDS + 1) * 0.030 * 16
    assert autocal._forecast(out[:5], (64 << 10,), 1 << 20) == pytest.approx(
        0.020 * 16 * (1 + autocal._rounds(0.020 * 16)))


def test_auto_calibration_gives_cheap_sizes_more_rounds_within_bounds() -> None:
    from approxdist.comm.collectives import autocal

    assert autocal._rounds(10.0) == autocal.ROUNDS  # a slow size still gets its minimum
    assert autocal._rounds(1e-6) == autocal.MAX_ROUNDS  # a fast one is capped
    assert autocal._rounds(autocal.SIZE_S / (autocal.ROUNDS + 5.5)) == autocal.ROUNDS + 5
    assert autocal._rounds(0.0) == autocal.MAX_ROUNDS


def test_calibration_windows_scores_each_window_pick_against_the_full_run() -> None:
    """A window that sees only `b`'s fast rounds picks it; over the whole run `a` is the
    best by median, so that window's pick scores `b`'s full median over `a`'s."""
    from approxdist.comm.collectives.calibration_windows import quantile, window_picks

    times = {"a": [2.0] * 10, "b": [1.0, 1.0, 1.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0]}
    ratios = window_picks(times, 3, statistics.median, stride=1)
    # rounds 0-2 and 1-3 see b mostly at 1.0: b picked, its full median 5.0 / a's 2.0
    assert ratios[:2] == [2.5, 2.5]
    assert ratios[2:] == [1.0] * 6  # every later window sees b mostly slow: a picked
    assert len(ratios) == 8
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert quantile([1.0, 2.0], 0.0) == 1.0 and quantile([1.0, 2.0], 1.0) == 2.0
