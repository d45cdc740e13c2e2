"""`plan validate`'s held-out set: models no calibration setting uses, refused otherwise."""

from __future__ import annotations

import pytest

from approxdist.cli.main import main
from approxdist.cli.plan_validate import CALIBRATION_MODELS
from approxdist.config.loader import build_config
from approxdist.errors import ConfigError
from approxdist.planner.validation import engine_runs
from approxdist.planner.validation.configs import (
    CALIBRATION,
    HELD_OUT,
    MODELS,
    TENSOR_MODELS,
    check_held_out,
)


def test_held_out_models_are_none_of_the_calibration_models_and_build() -> None:
    assert set(map(id, CALIBRATION_MODELS)) == set(map(id, (
        *MODELS.values(), *TENSOR_MODELS.values(), engine_runs.TINY, engine_runs.WIDE,
        engine_runs.SHARED, engine_runs.DEEP)))  # every model the design was judged or fitted on
    assert check_held_out(HELD_OUT, CALIBRATION_MODELS) == HELD_OUT
    assert not {s.key for s in HELD_OUT} & {s.key for s in CALIBRATION}
    assert {s.world_size for s in HELD_OUT} == {2, 3, 4}
    assert len({s.key for s in HELD_OUT}) == len(HELD_OUT) == 10
    for s in HELD_OUT:
        assert build_config(s.model.sections).model.name == s.model.name


def test_a_held_out_setting_on_a_calibration_model_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"held-out setting resnet20/N2/loopback/fp32 uses "
                                          r"model 'resnet20', a calibration model; hold out"):
        check_held_out((CALIBRATION[9],), CALIBRATION_MODELS)


def test_held_out_and_another_set_of_settings_exit_2(capsys) -> None:
    assert main(["plan", "validate", "--held-out", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--quick and --held-out pick two sets of settings; give one (--only "
                        "narrows either)") and len(err.splitlines()) == 1
    assert main(["plan", "validate", "--held-out", "--only", "resnet20"]) == 2
    assert "--only 'resnet20' matches no configuration; keys look like resnet56/N2/loopback/fp32" \
        in capsys.readouterr().err
