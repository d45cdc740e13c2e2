"""The [dp] section and its flags: defaults, validation, and the link rule per engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from approxdist.cli.main import build_parser
from approxdist.cli.train_flags import flag_layer
from approxdist.config import load_config, write_config
from approxdist.config.loader import build_config
from approxdist.config.wire import Wire
from approxdist.errors import ConfigError
from approxdist.train.check import check_parts
from approxdist.train.mode import modes


def test_defaults_use_our_engine_and_round_trip(tmp_path: Path) -> None:
    cfg = build_config({"wire": {"grad": {"rules": ["*.bias=fp32", "type:Conv2d.weight=bf16"]}}})
    assert (cfg.dp.reducer, cfg.dp.algorithm, cfg.wire.grad.codec) == ("approxdist", "auto",
                                                                      "fp32")
    assert cfg.wire.grad.rules == ("*.bias=fp32", "type:Conv2d.weight=bf16")
    write_config(cfg, tmp_path / "c.toml")
    assert load_config(tmp_path / "c.toml") == cfg


@pytest.mark.parametrize(("dp", "message"), [
    ({"reducer": "nccl"}, "dp.reducer = 'nccl' is not one of: approxdist, plain"),
    ({"reducer": "plain", "threads": 3}, "'plain' takes none of dp.threads"),
    ({"threads": 0}, "threads = 0 must be >= 1"),
    ({"bucket_mb": -1.0}, "bucket sizes must be >= 0 MB"),
    ({"gil_switch_ms": -1.0}, "dp.gil_switch_ms = -1.0 must be >= 0"),
])
def test_bad_dp_values_are_named_by_the_config(dp: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config({"dp": dp})


@pytest.mark.parametrize(("sections", "message"), [
    ({"dp": {"algorithm": "tree"}}, "dp.algorithm = 'tree' is not one of"),
    ({"wire": {"grad": {"codec": "fp7"}}}, "wire.grad.codec = 'fp7': unknown codec spec 'fp7'"),
    ({"wire": {"grad": {"rules": ["conv"]}}}, "wire.grad.rules = 'conv': .*has no '='"),
    ({"wire": {"grad": {"rules": ["*.bias=fp7"]}}},
     r"wire.grad.rules = '\*.bias=fp7': unknown codec"),
    ({"dp": {"reducer": "plain"}, "wire": {"grad": {"codec": "bf16"}}},
     "dp.reducer = 'plain' takes none of wire.grad.codec"),
    ({"train": {"parallel": "ps"}, "ps": {"servers": 1, "workers": 1},
      "wire": {"push": {"rules": ["*.bias=fp32"]}}},
     "wire.push.rules: per-parameter codec rules are for the data-parallel gradient wire"),
    ({"comm": {"link": "bw=fast"}}, "comm.link = 'bw=fast': bandwidth 'fast' is not <number>"),
    ({"train": {"parallel": "pipeline"}, "pipeline": {"schedule": "zb"}},
     "pipeline.schedule = 'zb' is not one of: 1f1b, gpipe"),
    ({"train": {"parallel": "pipeline"}, "wire": {"fwd": {"codec": "bits:x"}}},
     "wire.fwd.codec = 'bits:x': "),
    ({"train": {"parallel": "hybrid", "world_size": 4}, "pipeline": {"replicas": [2]},
      "wire": {"bwd": {"channel": "ber:2@5"}}},
     "wire.bwd.channel = 'ber:2@5': "),
    ({"pipeline": {"schedule": "1f1b"}},
     "pipeline.schedule = '1f1b' is not used by --parallel dp; drop it, or use --parallel "
     "hybrid or pipeline"),
])
def test_names_are_checked_against_the_parts(sections: dict, message: str) -> None:
    """config/ knows no codec or schedule: `check_parts` checks the names against the parts,
    before any worker starts and when a rank builds its trainer; one line naming the key."""
    cfg = build_config(sections)  # the config itself accepts any name
    with pytest.raises(ConfigError, match=message) as info:
        check_parts(cfg)
    assert len(str(info.value).splitlines()) == 1


def test_error_feedback_is_for_gradient_wires_only() -> None:
    with pytest.raises(ConfigError, match="wire.fwd.error_feedback: error feedback, "
                                          "per-parameter rules and AdaPrec are for gradient "
                                          "wires"):
        build_config({"wire": {"fwd": {"error_feedback": True}}})


def test_placement_needs_a_pipeline() -> None:
    with pytest.raises(ConfigError, match=r"pipeline.placement = \(1, 0\) is not used by "
                                          r"--parallel dp; drop it, or use --parallel hybrid "
                                          r"or pipeline"):
        check_parts(build_config({"pipeline": {"placement": [1, 0]}}))


def test_link_needs_our_engine() -> None:
    assert build_config({"comm": {"link": "bw=1gbit"}}).comm.link == "bw=1gbit"
    with pytest.raises(ConfigError, match="use --dp-reducer approxdist"):
        check_parts(build_config({"comm": {"link": "bw=1gbit"}, "dp": {"reducer": "plain"}}))


def test_flags_land_in_the_dp_section() -> None:
    args = build_parser().parse_args([
        "train", "--dp-reducer", "approxdist", "--algorithm", "ring", "--codec", "bf16",
        "--error-feedback", "--bucket-mb", "4", "--threads", "3", "--chunk-kb", "256",
        "--no-overlap", "--early-forward", "--codec-rule", "*.bias=fp32", "--find-unused"])
    cfg = build_config(flag_layer(args, modes().get("dp")))
    grad = cfg.wire.grad
    assert cfg.dp.algorithm == "ring" and grad.codec == "bf16" and grad.error_feedback
    assert (cfg.dp.bucket_mb, cfg.dp.threads, cfg.dp.chunk_kb) == (4.0, 3, 256.0)
    assert not cfg.dp.overlap and cfg.dp.early_forward and cfg.dp.find_unused
    assert grad.rules == ("*.bias=fp32",)
    ps = build_config(flag_layer(args, modes().get("ps")))  # the ps's gradient wire: pushes
    assert ps.wire.push.codec == "bf16" and ps.wire.push.error_feedback and ps.wire.grad == Wire()
    assert build_config(flag_layer(build_parser().parse_args(["train"]), modes().get("dp"))).dp.overlap
