"""`plan validate --tensor`'s pure parts: its settings, the tp x dp candidates against data
parallelism, repricing them on another profile, and the config each runs with."""

from __future__ import annotations

import pytest

from approxdist.cli import plan_validate
from approxdist.cli.main import main
from approxdist.cli.plan_validate import sections
from approxdist.config.loader import build_config
from approxdist.errors import ConfigError
from approxdist.planner.cost import LinkLevel, Network
from approxdist.planner.cost.calibration_file import CostCalibration
from approxdist.planner.cost.overhead import RuntimeOverhead
from approxdist.planner.objective import SolverSettings
from approxdist.planner.profile import BlockProfile, Profile
from approxdist.planner.search import TensorSpace
from approxdist.planner.tp_layout import layout_of
from approxdist.planner.validation.candidates import repriced, tensor_candidates
from approxdist.planner.validation.configs import TENSOR, select


def mlp(scale: float = 1.0) -> tuple[Profile, TensorSpace]:
    """The setting's mlp (3 hidden layers of 256 on 64 inputs, 32 samples) with made-up
    times, and its layout split over 2 and 4 ranks."""
    setting = select(TENSOR, "mlp/N4")[0]
    cfg = build_config(setting.model.sections)
    lay = layout_of(cfg.model, cfg.data, 32, "", (2, 4))
    blocks = tuple(BlockProfile(f"b{i}", 1e-3 * scale, 2e-3 * scale, 32 * 256 * 4,
                                sum(s for s, _ in b.params), 0, 0.0,
                                tuple(s for s, _ in b.params))
                   for i, b in enumerate(lay.blocks))
    return Profile("mlp", (64,), 32, 1, "test", "test", blocks), TensorSpace(lay, (2, 4))


def test_the_tensor_settings_are_mlp_and_gpt_tiny_on_2_and_4_ranks() -> None:
    assert {(s.model.label, s.world_size) for s in TENSOR} == \
        {(m, n) for m in ("mlp", "gpt-tiny") for n in (2, 4)}
    assert all(s.tensor and s.key.endswith("/tp") for s in TENSOR)
    assert len({s.key for s in TENSOR}) == len(TENSOR)


def test_every_mesh_and_data_parallelism_is_a_candidate_and_repriced() -> None:
    profile, tensor = mlp()
    base = SolverSettings(4, Network(LinkLevel.from_link("inter", "bw=1gbit,lat=50us")))
    found = tensor_candidates(profile, base, tensor)
    assert sorted(c.describe() for c in found) == ["dp=4", "tp=2,dp=2", "tp=4,dp=1"]
    assert found[0].choosers == ("ours",)
    assert found[0].ranked.per_sample_s == min(c.ranked.per_sample_s for c in found)
    slower, _ = mlp(1.5)
    for c in found:
        again = repriced(c, slower, base, tensor)
        assert (again.key, again.choosers) == (c.key, c.choosers)
        assert again.ranked.step_s > c.ranked.step_s  # more compute, same transfers
        assert repriced(c, profile, base, tensor).ranked.step_s == \
            pytest.approx(c.ranked.step_s)
    split = next(c for c in found if c.ranked.tp > 1)
    with pytest.raises(ConfigError, match="splits layers: reprice it with its TensorSpace"):
        repriced(split, slower, base)


def test_a_tensor_candidate_runs_as_train_plan_would() -> None:
    setting = select(TENSOR, "mlp/N4")[0]
    profile, tensor = mlp()
    base = SolverSettings(4, Network(LinkLevel.from_link("inter", "bw=1gbit")))
    for c in tensor_candidates(profile, base, tensor):
        cfg = build_config(sections(setting, c, profile, threads=1))
        assert cfg.train.world_size == 4 and cfg.train.parallel == c.ranked.mode
        if c.ranked.tp > 1:
            assert cfg.tp.size == c.ranked.tp and cfg.tp.plan == c.ranked.tp_plan
        replicas = 4 // c.ranked.tp
        assert cfg.data.batch_size == replicas * profile.micro_batch_size


def test_tensor_and_quick_together_is_one_line_exit_2(capsys) -> None:
    assert main(["plan", "validate", "--tensor", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--tensor and --quick pick two sets of settings" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(("tp_collective_s", "noted"), [(0.0, True), (4e-4, False)])
def test_a_calibration_without_the_tp_term_is_named_in_one_line(
        tmp_path, monkeypatch, capsys, tp_collective_s: float, noted: bool) -> None:
    path = CostCalibration.of(levels=(LinkLevel("loopback", 1e-4, 1e-9, 1e-9, cores=2),),
                              overhead=RuntimeOverhead(dp_step_s=1e-3,
                                                       tp_collective_s=tp_collective_s)
                              ).save(tmp_path / "cost.json")

    def stop(*args, **kwargs):
        raise ConfigError("stopped before timing")

    monkeypatch.setattr(plan_validate, "measure_setting", stop)
    assert main(["plan", "validate", "--tensor", "--only", "mlp/N2", "--calibration",
                 str(path)]) == 2
    out = capsys.readouterr().out
    assert ("prices no tensor-engine work per tp collective" in out) == noted
    assert ("refit with --calibrate-only --save-calibration FILE" in out) == noted
