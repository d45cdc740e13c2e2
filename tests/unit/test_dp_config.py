"""The [dp] section and its flags: defaults, validation, and the link rule per engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from approxdist.cli.main import build_parser
from approxdist.cli.train_cmd import flag_layer
from approxdist.config import load_config, write_config
from approxdist.config.loader import build_config
from approxdist.errors import ConfigError
from approxdist.train.check import check_parts
from approxdist.train.mode import modes


def test_defaults_use_our_engine_and_round_trip(tmp_path: Path) -> None:
    cfg = build_config({"dp": {"codec_rules": ["*.bias=fp32", "type:Conv2d.weight=bf16"]}})
    assert (cfg.dp.engine, cfg.dp.algorithm, cfg.dp.codec) == ("approxdist", "hybrid", "fp32")
    assert cfg.dp.codec_rules == ("*.bias=fp32", "type:Conv2d.weight=bf16")
    write_config(cfg, tmp_path / "c.toml")
    assert load_config(tmp_path / "c.toml") == cfg


@pytest.mark.parametrize(("dp", "message"), [
    ({"engine": "nccl"}, "dp.engine = 'nccl' is not one of: approxdist, plain"),
    ({"engine": "plain", "codec": "bf16"}, "'plain' takes none of dp.codec"),
    ({"threads": 0}, "threads = 0 must be >= 1"),
    ({"bucket_mb": -1.0}, "bucket sizes must be >= 0 MB"),
    ({"gil_switch_ms": -1.0}, "dp.gil_switch_ms = -1.0 must be >= 0"),
])
def test_bad_dp_values_are_named_by_the_config(dp: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config({"dp": dp})


@pytest.mark.parametrize(("sections", "message"), [
    ({"dp": {"algorithm": "tree"}}, "dp.algorithm = 'tree' is not one of"),
    ({"dp": {"codec": "fp7"}}, "dp.codec = 'fp7': unknown codec spec 'fp7'"),
    ({"dp": {"codec_rules": ["conv"]}}, "dp.codec_rules = 'conv': .*has no '='"),
    ({"dp": {"codec_rules": ["*.bias=fp7"]}}, r"dp.codec_rules = '\*.bias=fp7': unknown codec"),
    ({"comm": {"link": "bw=fast"}}, "comm.link = 'bw=fast': bandwidth 'fast' is not <number>"),
    ({"train": {"parallel": "pipeline"}, "pipeline": {"schedule": "zb"}},
     "pipeline.schedule = 'zb' is not one of: 1f1b, gpipe"),
    ({"train": {"parallel": "pipeline"}, "pipeline": {"fwd_codec": "bits:x"}},
     "pipeline.fwd_codec = 'bits:x': "),
    ({"train": {"parallel": "hybrid", "world_size": 4}, "pipeline": {"bwd_channel": "ber:2@5"}},
     "pipeline.bwd_channel = 'ber:2@5': "),
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


def test_placement_needs_a_pipeline() -> None:
    with pytest.raises(ConfigError, match=r"pipeline.placement = \(1, 0\) is not used by "
                                          r"--parallel dp; drop it, or use --parallel hybrid "
                                          r"or pipeline"):
        check_parts(build_config({"pipeline": {"placement": [1, 0]}}))


def test_link_needs_our_engine() -> None:
    assert build_config({"comm": {"link": "bw=1gbit"}}).comm.link == "bw=1gbit"
    with pytest.raises(ConfigError, match="use --dp-engine approxdist"):
        check_parts(build_config({"comm": {"link": "bw=1gbit"}, "dp": {"engine": "plain"}}))


def test_flags_land_in_the_dp_section() -> None:
    args = build_parser().parse_args([
        "train", "--dp-engine", "approxdist", "--algorithm", "ring", "--codec", "bf16",
        "--error-feedback", "--bucket-mb", "4", "--threads", "3", "--chunk-kb", "256",
        "--no-overlap", "--early-forward", "--codec-rule", "*.bias=fp32", "--find-unused"])
    cfg = build_config(flag_layer(args, modes().get("dp")))
    assert cfg.dp.algorithm == "ring" and cfg.dp.codec == "bf16" and cfg.dp.error_feedback
    assert (cfg.dp.bucket_mb, cfg.dp.threads, cfg.dp.chunk_kb) == (4.0, 3, 256.0)
    assert not cfg.dp.overlap and cfg.dp.early_forward and cfg.dp.find_unused
    assert cfg.dp.codec_rules == ("*.bias=fp32",)
    assert build_config(flag_layer(build_parser().parse_args(["train"]), modes().get("dp"))).dp.overlap
