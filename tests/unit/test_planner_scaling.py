"""Seed 001's s(N,b) from the cost model (`planner.scaling`, `approxdist simulate`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from approxdist.cli.main import main
from approxdist.planner.cost import LinkLevel
from approxdist.planner.profile import BlockProfile, Profile
from approxdist.planner.scaling import Input, ScalingModel, curve
from tests.helpers.pipedream import PROFILES


def model(bandwidth: str = "bw=1gbit", params: int = 4 << 20) -> ScalingModel:
    blocks = (BlockProfile("conv", 0.02, 0.04, 1024, 0, 0),
              BlockProfile("fc", 0.01, 0.02, 64, params, 0))
    profile = Profile("toy", (3,), 256, 1, "test", "test", blocks)
    return ScalingModel(profile, LinkLevel.from_link("inter", bandwidth),
                        Input("compute_scale", 1, 0.5, 2, "assumed"),
                        Input("batch_exponent", 1, 0.8, 1, "assumed"),
                        Input("bandwidth_scale", 1, 0.5, 1, "assumed"),
                        Input("gamma", 0, 0, 1e-9, "assumed"), algorithm="ring")


def test_free_communication_scales_perfectly_and_one_node_is_one() -> None:
    m = model(params=0)
    for n in (1, 2, 8, 64):
        for b in (256, 64):
            assert m.speedup(n, b) == pytest.approx(n)  # compute ~ b: s = N exactly
    assert model().speedup(1, 256) == 1.0


def test_exposed_all_reduce_by_hand() -> None:
    """2 nodes, b = 256, no overlap: t = compute + ring all-reduce of 4 MiB at 1 Gbit/s
    (2 (N-1)/N S beta with N = 2: S beta), so s = 2 t1 / t2."""
    m = ScalingModel(**{**vars(model()), "overlap": False})
    t1, ring = 0.09, (4 << 20) * 8e-9
    assert m.step_s(2, 256) == pytest.approx(t1 + ring)
    assert m.speedup(2, 256) == pytest.approx(2 * t1 / (t1 + ring))


def test_band_holds_the_value_and_rows_have_the_keys() -> None:
    rows = curve(model(), [1, 4, 16], [256, 32])
    assert [(r["nodes"], r["per_node_batch"]) for r in rows] == \
        [(1, 256), (4, 256), (16, 256), (1, 32), (4, 32), (16, 32)]
    for r in rows:
        assert r["speedup_low"] <= r["speedup"] + 1e-12 <= r["speedup_high"] + 2e-12
    slow = model().sensitivity(16, 32)["bandwidth_scale"]
    assert slow[0] < slow[1]  # half the bandwidth, a smaller speed-up


def test_simulate_command_writes_rows_and_names_inputs(tmp_path: Path, capsys) -> None:
    out = tmp_path / "s.json"
    assert main(["simulate", "--model", "alexnet", "--profile", str(PROFILES / "alexnet.txt"),
                 "--nodes", "1,64", "--per-node-batch", "256", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["nodes"] for r in rows] == [1, 64] and rows[1]["seed001"] == 60.4
    assert {"nodes", "per_node_batch", "speedup", "speedup_low", "speedup_high"} <= set(rows[0])
    text = capsys.readouterr().out
    assert "compute_scale = 7 [4, 12] (assumed" in text and "band at N=64, b=256" in text
    assert main(["simulate", "--profile", str(PROFILES / "alexnet.txt"), "--compute-scale",
                 "x"]) == 2
    assert "--compute-scale 'x' must be VALUE or VALUE,LOW,HIGH" in capsys.readouterr().err
