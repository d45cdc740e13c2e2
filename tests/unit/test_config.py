"""Typed config: defaults, files, overrides, and the errors bad input gets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from approxdist.config import load_config, parse_overrides, to_dict, write_config
from approxdist.config.loader import build_config
from approxdist.errors import ConfigError
from approxdist.train.check import check_parts
from approxdist.train.mode import modes


def test_defaults_are_the_main_job() -> None:
    cfg = load_config()
    assert (cfg.train.parallel, cfg.train.world_size) == ("dp", 2)
    assert (cfg.model.name, cfg.data.dataset) == ("resnet20", "digits")


def test_file_then_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[optim]\nlr = 0.5\nschedule = "step"\n[data]\nsynthetic_shape = [1, 4, 4]\n')
    cfg = load_config(f, parse_overrides(["optim.lr=0.25", "data.augment=false"]))
    assert cfg.optim.lr == 0.25 and cfg.optim.schedule == "step"
    assert cfg.data.synthetic_shape == (1, 4, 4) and cfg.data.augment is False


def test_round_trip_through_toml(tmp_path: Path) -> None:
    cfg = load_config(None, parse_overrides(["model.name=mlp", "train.epochs=3"]))
    write_config(cfg, tmp_path / "config.toml")
    assert load_config(tmp_path / "config.toml") == cfg
    assert to_dict(cfg)["model"]["name"] == "mlp"


def test_int_accepted_for_float() -> None:
    assert load_config(None, parse_overrides(["optim.lr=1"])).optim.lr == 1.0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lrr=1", r"unknown key optim.lrr; valid keys of \[optim\]: lr, momentum"),
        ("optimm.lr=1", r"unknown config section 'optimm'; valid: train, data, model, optim"),
        ("optim.lr=abc", r"optim.lr = 'abc' must be of type float"),
        ("train.epochs=1.5", r"train.epochs = 1.5 must be an integer"),
        ("train.progress=1", r"train.progress = 1 must be true or false"),
        ("optim.lr=-1", r"optim.lr = -1.0 must be > 0"),
        ("train.world_size=0", r"train.world_size = 0 must be >= 1"),
        ("data.synthetic_shape=3", r"data.synthetic_shape = 3 must be a list of int"),
        ("lr=1", r"override 'lr=1' must look like section.key=value"),
    ],
)
def test_bad_values_name_the_value(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, parse_overrides([override]))


def test_an_unknown_mode_lists_the_records() -> None:
    with pytest.raises(ConfigError, match=r"unknown parallel mode 'zz'; valid: dp, hybrid, "
                                          r"pipeline, ps, single"):
        check_parts(load_config(None, parse_overrides(["train.parallel=zz"])))


def test_a_list_or_table_as_a_name_is_an_unknown_name() -> None:
    """`parallel = []` in a config file reaches the registry before the type check."""
    for name in ([], {"a": 1}):
        with pytest.raises(ConfigError, match=rf"unknown parallel mode {re.escape(repr(name))}; "
                                              r"valid: dp, "):
            modes().get(name)  # type: ignore[arg-type]


def test_batch_must_divide_world() -> None:
    with pytest.raises(ConfigError, match=r"data.batch_size \(100\) .* world size \(3\).*try 99 or 102"):
        check_parts(build_config({"train": {"world_size": 3}, "data": {"batch_size": 100}}))


def test_single_mode_rejects_world_size() -> None:
    with pytest.raises(ConfigError, match="use --world-size 1 or --parallel dp"):
        check_parts(build_config({"train": {"parallel": "single", "world_size": 2}}))


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[optim\nlr=1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    flat = tmp_path / "flat.toml"
    flat.write_text("lr = 1\n")
    with pytest.raises(ConfigError, match="top-level key 'lr' must be a \\[section\\]"):
        load_config(flat)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"[model]\nname = 'caf\xe9'\n")
    with pytest.raises(ConfigError, match=r"latin.toml' is not UTF-8 text \(byte 19\); save it"):
        load_config(latin)


def test_config_is_frozen() -> None:
    cfg = load_config()
    with pytest.raises(AttributeError):
        cfg.optim.lr = 3.0  # type: ignore[misc]
