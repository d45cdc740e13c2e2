"""Fitting alpha, beta, gamma to bench rows, and the calibration file's round trip and errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from approxdist.errors import ConfigError, DataError
from approxdist.planner.cost import (
    FITTED,
    CodecCost,
    CostCalibration,
    LinkLevel,
    allreduce_time,
    fit_level,
    read_rows,
)

DATA = Path(__file__).parent.parent / "data" / "cost"
SIZES = (4096, 65536, 1 << 20, 16 << 20)


def _rows(level: LinkLevel, algorithms: tuple[str, ...] = FITTED, worlds: tuple[int, ...] = (2, 4),
          codec: CodecCost | None = None, link: str = "none") -> list[dict[str, Any]]:
    """Rows as `bench allreduce --json` writes them, timed by the model itself."""
    codec = codec or CodecCost.of("fp32")
    return [{"algorithm": a, "codec": codec.spec, "size_bytes": s, "world_size": n,
             "median_s": allreduce_time(level, a, n, s // 4, codec), "link": link}
            for a in algorithms for n in worlds for s in SIZES]


def test_the_fit_recovers_the_coefficients_that_made_the_rows() -> None:
    truth = LinkLevel("intra", 2e-4, 1e-9, 4e-10)
    fit = fit_level("intra", _rows(truth))
    assert fit.level.alpha_s == pytest.approx(2e-4, rel=1e-6)
    assert fit.level.beta_s_per_byte == pytest.approx(1e-9, rel=1e-6)
    assert fit.level.gamma_s_per_byte == pytest.approx(4e-10, rel=1e-6)
    assert fit.rows == 32 and fit.rms_rel_error < 1e-9 and fit.world_sizes == (2, 4)


def test_loopback_rows_are_fitted_per_core() -> None:
    truth = LinkLevel("loopback", 3e-4, 6e-10, 2e-10, cores=2)
    fit = fit_level("loopback", _rows(truth, worlds=(2, 4, 8)), cores=2)
    assert fit.level.cores == 2 and fit.world_sizes == (2, 4, 8)
    for got, want in ((fit.level.alpha_s, 3e-4), (fit.level.beta_s_per_byte, 6e-10),
                      (fit.level.gamma_s_per_byte, 2e-10)):
        assert got == pytest.approx(want, rel=1e-6)


def test_rows_of_one_algorithm_cannot_tell_gamma_from_beta() -> None:
    # ring sends twice the bytes it adds, so only beta + gamma / 2 is determined: gamma
    # stays 0 and beta carries it
    truth = LinkLevel("intra", 2e-4, 1e-9, 4e-10)
    fit = fit_level("intra", _rows(truth, algorithms=("ring",)))
    assert fit.level.gamma_s_per_byte == 0.0
    assert fit.level.beta_s_per_byte == pytest.approx(1e-9 + 4e-10 / 2, rel=1e-6)
    assert fit.level.alpha_s == pytest.approx(2e-4, rel=1e-6)


def test_p2p_rows_pin_alpha_and_beta_so_ring_rows_give_gamma() -> None:
    truth = LinkLevel("intra", 2e-4, 1e-9, 4e-10)
    p2p = [{"size_bytes": s, "median_s": truth.p2p_s(s)} for s in SIZES]
    fit = fit_level("intra", _rows(truth, algorithms=("ring",)), p2p)
    assert fit.level.gamma_s_per_byte == pytest.approx(4e-10, rel=1e-6)
    assert fit.rows == 8 + 4  # ring on 2 and 4 ranks at 4 sizes, 4 p2p sizes
    only_p2p = fit_level("intra", p2p_rows=p2p)
    assert (only_p2p.level.alpha_s, only_p2p.level.beta_s_per_byte) == \
        pytest.approx((2e-4, 1e-9), rel=1e-6)


def test_codec_rows_count_with_their_known_coding_and_an_emulated_links_segments() -> None:
    truth = LinkLevel("inter", 1e-4, 8e-9, 3e-10)
    bf16 = CodecCost("bf16", 2e-10, 1e-10)
    rows = _rows(truth, codec=bf16, link="bw=1gbit")
    for r in rows:  # the bench used 1 MiB segments on the emulated link (`link_segment`)
        r["median_s"] = allreduce_time(truth, r["algorithm"], r["world_size"],
                                       r["size_bytes"] // 4, bf16, segment_bytes=1 << 20)
    fit = fit_level("inter", rows, codecs={"bf16": bf16})
    assert (fit.level.alpha_s, fit.level.beta_s_per_byte, fit.level.gamma_s_per_byte) == \
        pytest.approx((1e-4, 8e-9, 3e-10), rel=1e-6)
    assert fit.link == "bw=1gbit"


def test_rows_the_model_does_not_count_are_skipped() -> None:
    truth = LinkLevel("intra", 2e-4, 1e-9, 4e-10)
    noise = [{"algorithm": a, "codec": c, "size_bytes": 4096, "world_size": w, "median_s": 9.0}
             for a, c, w in (("native", "fp32", 2), ("auto", "fp32", 2), ("ring", "bf16", 2),
                             ("ring", "fp32", 1))]
    fit = fit_level("intra", _rows(truth) + noise)
    assert fit.rows == 32 and fit.rms_rel_error < 1e-9


def test_bad_rows_say_which_and_how() -> None:
    truth = LinkLevel("intra", 2e-4, 1e-9, 4e-10)
    two_links = _rows(truth, link="none") + _rows(truth, link="bw=1gbit")
    with pytest.raises(ConfigError, match=r"measured on links bw=1gbit, none; fit one level at a "
                                          r"time with link="):
        fit_level("intra", two_links)
    assert fit_level("intra", two_links, link="none").rows == 32
    with pytest.raises(DataError, match=r"1 usable measurement\(s\) for level 'intra'.*need >= 2"):
        fit_level("intra", _rows(truth)[:1])
    with pytest.raises(DataError, match=r"allreduce row 0 median_s = -0.1 must be a number of "
                                        r"seconds > 0"):
        fit_level("intra", [{**_rows(truth)[0], "median_s": -0.1}])
    with pytest.raises(DataError, match=r"allreduce row 0 lacks 'world_size'"):
        fit_level("intra", [{k: v for k, v in _rows(truth)[0].items() if k != "world_size"}])
    with pytest.raises(DataError, match=r"p2p row 1 = 3 is not an object"):
        fit_level("intra", p2p_rows=[{"size_bytes": 1, "median_s": 1.0}, 3])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match=r"give the shared cores for 'loopback'"):
        fit_level("loopback", _rows(truth))


def test_the_model_explains_the_measured_tables_of_docs_collectives() -> None:
    """fp32, 2 and 4 gloo ranks on the 2-core machine (docs/collectives.md): every
    coefficient is identified (four algorithms, two world sizes) and the un-overlapped
    critical path explains the medians within the noise those tables report."""
    rows = read_rows(DATA / "bench-allreduce-collectives-md.json", "bench allreduce --json")
    fit = fit_level("loopback", rows, cores=2)
    level = fit.level
    assert level.alpha_s > 0 and level.beta_s_per_byte > 0 and level.gamma_s_per_byte > 0
    assert fit.rows == 40 and fit.world_sizes == (2, 4)
    assert fit.rms_rel_error < 0.4 and fit.max_rel_error < 0.75


def test_a_real_bench_allreduce_file_reads() -> None:
    rows = read_rows(DATA / "bench-allreduce-tiny.json", "bench allreduce --json")
    fit = fit_level("loopback", rows, cores=2, source="bench-allreduce-tiny.json")
    assert fit.rows == 16 and fit.link == "none" and fit.world_sizes == (2,)


def test_the_file_round_trips(tmp_path: Path) -> None:
    truth = LinkLevel("loopback", 3e-4, 6e-10, 2e-10, cores=2)
    fit = fit_level("loopback", _rows(truth), cores=2, source="rows.json")
    inter = LinkLevel.from_link("inter", "bw=1gbit,lat=100us")
    bf16 = CodecCost("bf16", 2e-10, 1e-10)
    cal = CostCalibration.of((fit,), (inter,), {"bf16": bf16})
    loaded = CostCalibration.load(cal.save(tmp_path / "cal.json"))
    assert loaded.levels == cal.levels and loaded.codecs == cal.codecs
    assert loaded.fits["loopback"] == fit and "inter" not in loaded.fits
    assert json.loads((tmp_path / "cal.json").read_text())["format"] == "approxdist-cost-calibration"
    assert loaded.level("inter") == inter and loaded.codec("bf16") == bf16
    assert loaded.codec("fp8-e5m2") == CodecCost.of("fp8-e5m2")  # unmeasured: the default
    with pytest.raises(ConfigError, match=r"no link level 'intra'; it has inter, loopback"):
        loaded.level("intra")


GOOD: dict[str, Any] = {"format": "approxdist-cost-calibration", "version": 1,
        "levels": {"intra": {"alpha_s": 1e-5, "beta_s_per_byte": 1e-10, "gamma_s_per_byte": 0.0}},
        "codecs": {}}


@pytest.mark.parametrize("text, match", [
    ("[1, 2]", r"is not an approxdist cost calibration \(format = 'list'"),
    ('{"format": "approxdist-profile"}', r"format = 'approxdist-profile', expected "
                                         r"'approxdist-cost-calibration'"),
    (json.dumps({**GOOD, "version": 7}), r"has version 7; this approxdist reads version 1"),
    (json.dumps({**GOOD, "extra": 1}), r"has unknown key\(s\) 'extra'"),
    (json.dumps({**GOOD, "levels": {"intra": {"alpha_s": 1e-5}}}),
     r"levels\['intra'\] lacks 'beta_s_per_byte', 'gamma_s_per_byte'"),
    (json.dumps({**GOOD, "levels": {"intra": {**GOOD["levels"]["intra"], "beta_s_per_byte": -1}}}),
     r"levels\['intra'\]: .*beta_s_per_byte = -1 must be a finite number >= 0"),
    (json.dumps({**GOOD, "levels": {"wan": GOOD["levels"]["intra"]}}),
     r"link level 'wan' is not one of"),
    (json.dumps({**GOOD, "codecs": {"bf16": {"encode_s_per_byte": 1e-10}}}),
     r"codecs\['bf16'\] lacks 'decode_s_per_byte'"),
    (json.dumps({**GOOD, "codecs": {"bits:q": {"encode_s_per_byte": 0, "decode_s_per_byte": 0}}}),
     r"codecs\['bits:q'\]: .*bits:q"),
    ("{oops", r"is not JSON \(.*\); fit one with approxdist.planner.cost.fit_level"),
])
def test_a_bad_file_is_one_line_naming_file_key_and_value(tmp_path: Path, text: str,
                                                          match: str) -> None:
    path = tmp_path / "cal.json"
    path.write_text(text)
    with pytest.raises(DataError, match=match) as info:
        CostCalibration.load(path)
    assert "\n" not in str(info.value) and "cal.json" in str(info.value)


def test_a_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"does not exist; fit one with"):
        CostCalibration.load(tmp_path / "none.json")
    (tmp_path / "good.json").write_text(json.dumps(GOOD))
    assert CostCalibration.load(tmp_path / "good.json").level("intra").alpha_s == 1e-5
