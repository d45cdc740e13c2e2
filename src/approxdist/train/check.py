"""A config against the parts it names: codecs, channels, the link, algorithms, schedules.

`config/` only knows its own values (ranges, fixed choices, syntax), so it need not
import the layers it configures. The names it holds are checked here, against the
registries of the parts that will be built: `check_parts(cfg)` runs before any worker
starts (`approxdist train`'s preflight, `approxdist experiment`) and again when a rank
builds its trainer (under torchrun too). Each error names the key, the value and what
would be valid, as the config's own checks do.
"""

from __future__ import annotations

from approxdist.comm.channel import get_channel
from approxdist.comm.codecs import get_codec
from approxdist.comm.collectives import algorithm_names
from approxdist.comm.netem import parse_link
from approxdist.config.pipeline import PipelineConfig
from approxdist.config.schema import Config
from approxdist.data_parallel.codec_rules import CodecRules
from approxdist.errors import ApproxDistError, ConfigError
from approxdist.pipeline.schedule import schedule_names


def check_parts(cfg: Config) -> None:
    """Raise `ConfigError` (or `SpecError`) naming the first key whose value names no part."""
    if cfg.comm.link:
        parse_link(cfg.comm.link)  # SpecError naming the bad part of the spec
    if cfg.dp.engine == "approxdist":
        _check_dp(cfg)
    check_pipeline(cfg.pipeline)


def _check_dp(cfg: Config) -> None:
    if cfg.dp.algorithm not in algorithm_names():
        raise ConfigError(f"dp.algorithm = {cfg.dp.algorithm!r} is not one of: "
                          f"{', '.join(algorithm_names())}")
    CodecRules.parse(cfg.dp.codec_rules, cfg.dp.codec).validate()


def check_pipeline(p: PipelineConfig) -> None:
    """The `[pipeline]` section's schedule, codecs and channels."""
    if p.schedule not in schedule_names():
        raise ConfigError(f"pipeline.schedule = {p.schedule!r} is not one of: "
                          f"{', '.join(schedule_names())}")
    for key in ("fwd_codec", "bwd_codec", "fwd_channel", "bwd_channel"):
        _check_spec(f"pipeline.{key}", getattr(p, key), "codec" if key.endswith("codec") else "channel")


def _check_spec(key: str, value: str, kind: str) -> None:
    """Build the codec / channel once so a bad spec fails here, naming the key."""
    try:
        get_codec(value) if kind == "codec" else get_channel(value)
    except ApproxDistError as exc:
        lines = str(exc).splitlines()
        rest = "; ".join(" ".join(line.split()) for line in lines[1:])
        raise ConfigError(f"{key} = {value!r}: {lines[0]}" + (f" {rest}" if rest else "")) from None
