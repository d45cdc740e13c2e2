"""`simulate --fit` and time to accuracy (`planner.simfit`): fits that recover known inputs,
the jitter terms by hand, labelled tables and their bad input."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from approxdist.cli.main import main
from approxdist.errors import ConfigError, DataError
from approxdist.planner.cost import LinkLevel
from approxdist.planner.profile import BlockProfile, Profile, write_profile
from approxdist.planner.scaling import Input, ScalingModel, jitter_s
from approxdist.planner.simfit.accuracy import published_curve, read_curve, time_to_accuracy
from approxdist.planner.simfit.fit import fit
from approxdist.planner.simfit.points import (
    SEED001_SPEEDUP,
    SEED001_TIME_TO_ACCURACY,
    Point,
    Reached,
    read_points,
    read_reached,
)

PROFILE = Profile("toy", (3,), 256, 1, "test", "test", (
    BlockProfile("conv", 0.02, 0.04, 1024, 1 << 16, 0),
    BlockProfile("fc", 0.01, 0.02, 64, 8 << 20, 0)))


def toy(bandwidth_scale: float = 1.0, jitter: float = 0.0) -> ScalingModel:
    return ScalingModel(PROFILE, LinkLevel.from_link("inter", "bw=1gbit,lat=10us"),
                        Input("compute_scale", 1, 1, 1, "assumed"),
                        Input("batch_exponent", 1, 1, 1, "assumed"),
                        Input("bandwidth_scale", bandwidth_scale, 0.05, 4, "assumed"),
                        Input("gamma", 0, 0, 0, "assumed"),
                        jitter=Input("jitter", jitter, 0, 0.1, "assumed"),
                        early_forward=True, algorithm="ring")


def test_jitter_terms_by_hand() -> None:
    assert jitter_s(2.0, 0.1, 64, "gauss") == pytest.approx(0.2 * math.sqrt(2 * math.log(64)))
    assert jitter_s(2.0, 0.1, 4, "exp") == pytest.approx(0.2 * (1 / 2 + 1 / 3 + 1 / 4))
    assert jitter_s(2.0, 0.1, 1, "exp") == jitter_s(2.0, 0.1, 1, "gauss") == 0.0
    with pytest.raises(ConfigError, match="tail 'cauchy' is not one of gauss, exp"):
        jitter_s(1.0, 0.1, 2, "cauchy")


def test_fit_recovers_the_inputs_that_made_the_points_and_predicts_the_rest() -> None:
    truth = toy(bandwidth_scale=0.3, jitter=0.02)
    points = [Point(n, b, truth.speedup(n, b)) for n, b in ((4, 256), (8, 64), (8, 32),
                                                             (32, 256), (32, 64))]
    got = fit(toy(), points, ("bandwidth_scale", "jitter"), max_nodes=8)
    values = {i.name: i for i in got.model.inputs}
    assert values["bandwidth_scale"].value == pytest.approx(0.3, rel=1e-3)
    assert values["jitter"].value == pytest.approx(0.02, rel=1e-2)
    assert values["jitter"].source == "fitted" and values["gamma"].source == "assumed"
    assert [r["role"] for r in got.rows] == ["fit"] * 3 + ["predicted"] * 2
    for r in got.rows:
        assert abs(float(r["error"])) < 2e-3
        assert float(r["fit_low"]) <= float(r["speedup"]) <= float(r["fit_high"])
    held = fit(toy(), points, ("bandwidth_scale", "jitter"), 8, predict=[(8, 32)])
    assert [r["role"] for r in held.rows][2] == "predicted"


def test_fewer_points_than_inputs_and_unknown_inputs_are_refused() -> None:
    points = [Point(4, 256, 3.9), Point(64, 256, 50.0)]
    with pytest.raises(ConfigError, match=r"fitting 2 inputs \(bandwidth_scale, jitter\) on 1 "
                                          r"point\(s\) with N <= 8: give at least 2 points"):
        fit(toy(), points, ("bandwidth_scale", "jitter"), 8)
    with pytest.raises(ConfigError, match="--fit 'beta' is not an input"):
        fit(toy(), points, ("beta",), 8)
    with pytest.raises(ConfigError, match="--fit compute_scale: its band is one value"):
        fit(toy(), points, ("compute_scale",), 8)


def test_seed_tables_are_labelled_and_read() -> None:
    table, points = read_points(SEED001_SPEEDUP)
    assert table.source.startswith("published, seed 001") and table.dataset_samples == 1281167
    assert (256, 256, 217.0) in [(p.nodes, p.per_node_batch, p.speedup) for p in points]
    _, reached = read_reached(SEED001_TIME_TO_ACCURACY)
    first = reached[0]
    assert (first.nodes, first.seconds) == (1, 23 * 3600 + 34 * 60)
    assert math.isinf(reached[-1].seconds) and math.isnan(reached[-1].speedup)


def test_time_to_accuracy_from_a_published_curve_by_hand() -> None:
    """Published: s(4, 128) = 2 and S = 3 to 40 % (global batch 512), so E(256) / E(512) =
    3 / 2; the model's S at (4, 128) is then 1.5 x its own s(4, 128). Never stays never; a
    row without a published step time gets no check."""
    reached = [Reached(1, 256, 40, 100.0, 1.0), Reached(4, 128, 40, 33.0, 3.0),
               Reached(8, 128, 40, math.inf, math.nan), Reached(2, 64, 40, 50.0, 2.0)]
    curve = published_curve(reached, [Point(4, 128, 2.0)])
    assert curve == {(256, 40): 1.0, (512, 40): 1.5, (1024, 40): math.inf}
    model = toy()
    rows = time_to_accuracy(model, reached, curve)
    s = model.speedup(4, 128)
    assert rows[0]["simulated"] == pytest.approx(1.5 * s) and rows[0]["step_speedup"] == s
    err = 1.5 * s / 3.0 - 1
    assert rows[0]["verdict"].startswith(f"{err:+.0%}: " + ("reproduced" if abs(err) <= 0.2
                                                          else "not reproduced"))
    assert rows[1]["verdict"] == "never reaches it; published: never (reproduced)"
    assert str(rows[2]["verdict"]).startswith("no check: no epochs to 40 % at global batch 128")


def test_epochs_file_needs_the_reference_batch(tmp_path: Path) -> None:
    f = tmp_path / "e.csv"
    f.write_text("global_batch,accuracy,epochs\n256,40,10\n4096,40,8\n4096,50,\n")
    with pytest.raises(DataError, match="no finite epochs at the reference batch 256 for "
                                        "accuracy 50"):
        read_curve(f, 256)
    f.write_text("global_batch,accuracy,epochs\n256,40,10\n4096,40,8\n")
    assert read_curve(f, 256) == {(256, 40.0): 1.0, (4096, 40.0): 1.25}


def _toy_files(tmp_path: Path) -> tuple[Path, Path]:
    profile = tmp_path / "toy.json"
    write_profile(PROFILE, profile)
    truth = replace(toy(0.3, 0.02))
    points = tmp_path / "points.csv"
    points.write_text("# source: made by the test\n# dataset_samples: 100000\n"
                      "nodes,per_node_batch,speedup\n" + "".join(
                          f"{n},{b},{truth.speedup(n, b):.4f}\n"
                          for n, b in ((4, 256), (8, 64), (8, 32), (32, 256))))
    return profile, points


def test_simulate_fit_command_and_a_curve_that_never_reaches(tmp_path: Path, capsys) -> None:
    profile, points = _toy_files(tmp_path)
    tta = tmp_path / "tta.csv"
    tta.write_text("nodes,per_node_batch,accuracy,train_time,speedup\n1,256,40,10:00,1\n"
                   "8,64,40,,\n")
    epochs = tmp_path / "epochs.csv"
    epochs.write_text("global_batch,accuracy,epochs\n256,40,10\n512,40,\n")
    assert main(["simulate", "--profile", str(profile), "--link", "bw=1gbit,lat=10us",
                 "--compute-scale", "1", "--gamma", "0", "--fit", "--points", str(points),
                 "--fit-max-nodes", "8", "--time-to-accuracy", str(tta), "--epochs",
                 str(epochs), "--bandwidth-scale", "1,0.05,4", "--jitter", "0,0,0.1"]) == 0
    out = capsys.readouterr().out
    assert "fit of bandwidth_scale, jitter on the points of points.csv (made by the test)" in out
    assert "predicted     32   256" in out
    assert "never reaches it; published: never (reproduced)" in out
    assert re.search(r"bandwidth_scale = 0\.(29|30)\d* \[[0-9., ]+\] \(fitted: fit on 3 points "
                     r"with N <= 8", out)


@pytest.mark.parametrize("row, message", [
    ("0,256,1.0", "row 1: nodes = 0 is outside the model's domain (N >= 1"),
    ("4,50000,3.0", "row 1: global batch 4 x 50000 = 200000 is larger than the data set "
                    "(100000 samples"),
])
def test_points_outside_the_domain_exit_2_with_one_line(tmp_path: Path, capsys, row: str,
                                                        message: str) -> None:
    profile, points = _toy_files(tmp_path)
    points.write_text(f"# dataset_samples: 100000\nnodes,per_node_batch,speedup\n{row}\n")
    assert main(["simulate", "--profile", str(profile), "--fit", "jitter", "--points",
                 str(points)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
