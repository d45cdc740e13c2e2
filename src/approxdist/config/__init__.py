"""Typed run configuration: frozen dataclasses, TOML files and `section.key=value` overrides."""

from approxdist.config.loader import load_config, parse_overrides, to_dict, write_config
from approxdist.config.schema import Config, DataConfig, ModelConfig, OptimConfig, TrainConfig

__all__ = [
    "Config", "DataConfig", "ModelConfig", "OptimConfig", "TrainConfig",
    "load_config", "parse_overrides", "to_dict", "write_config",
]
