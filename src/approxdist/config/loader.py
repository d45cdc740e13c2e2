"""Building a `Config` from TOML files and overrides, type-checked, and writing it back."""

from __future__ import annotations

import dataclasses
import functools
import sys
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType, UnionType
from typing import Any

import tomli_w

from approxdist.config.schema import Config
from approxdist.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

Sections = dict[str, dict[str, Any]]


def _section_types() -> Mapping[str, type]:
    return _field_types(Config)


@functools.cache
def _field_types(cls: type) -> Mapping[str, Any]:
    """Each field's type (resolved once per class: `get_type_hints` evaluates every
    annotation's string anew on each call)."""
    hints = typing.get_type_hints(cls)
    return MappingProxyType({f.name: hints[f.name] for f in dataclasses.fields(cls)})


def _coerce(where: str, value: Any, typ: Any) -> Any:
    """Check `value` against `typ`; ints are accepted for floats and lists for tuples, a
    table for a nested section (`wire.grad`)."""
    if dataclasses.is_dataclass(typ) and isinstance(typ, type):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} = {value!r} must be a table of key = value, e.g. "
                              f"--set {where}.{dataclasses.fields(typ)[0].name}=...")
        return _build(where, typ, value)
    origin = typing.get_origin(typ)
    if origin is UnionType:  # `int | None`: unset is the default, a value its type
        (inner,) = (a for a in typing.get_args(typ) if a is not type(None))
        return _coerce(where, value, inner)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} = {value!r} must be a table of key = value, "
                              f"e.g. --set {where}.hidden=64")
        return dict(value)
    if origin is tuple:
        (inner, _) = typing.get_args(typ)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} = {value!r} must be a list of {inner.__name__}")
        return tuple(_coerce(f"{where}[{i}]", v, inner) for i, v in enumerate(value))
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is bool and not isinstance(value, bool):
        raise ConfigError(f"{where} = {value!r} must be true or false")
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where} = {value!r} must be an integer")
    if not isinstance(value, typ):
        raise ConfigError(f"{where} = {value!r} must be of type {typ.__name__}")
    return value


def build_config(sections: Mapping[str, Mapping[str, Any]]) -> Config:
    """Validate every key and type, then construct the frozen config."""
    types = _section_types()
    built: dict[str, Any] = {}
    for name, values in sections.items():
        if name not in types:
            raise ConfigError(f"unknown config section {name!r}; valid: {', '.join(types)}")
        if not isinstance(values, Mapping):
            raise ConfigError(f"config section [{name}] must be a table of keys")
        built[name] = _build(name, types[name], values)
    return Config(**built)


def _build(where: str, cls: type, values: Mapping[str, Any]) -> Any:
    """`cls(**values)`, each key known and of its type."""
    fields = _field_types(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(f"unknown key {where}.{key}; valid keys of [{where}]: "
                              f"{', '.join(fields)}")
        kwargs[key] = _coerce(f"{where}.{key}", value, fields[key])
    return cls(**kwargs)


def merge(base: Sections, extra: Mapping[str, Mapping[str, Any]]) -> Sections:
    """A new nested dict with `extra`'s keys laid over `base`'s."""
    out = {k: dict(v) for k, v in base.items()}
    for section, values in extra.items():
        mine = out.setdefault(section, {})
        for key, value in values.items():  # tables (model.args) merge key by key
            if isinstance(value, Mapping) and isinstance(mine.get(key), Mapping):
                value = {**mine[key], **value}
            mine[key] = value
    return out


def read_toml(path: str | Path) -> Sections:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist; pass an existing TOML file")
    try:
        data = tomllib.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r} is not UTF-8 text (byte {exc.start}); "
                          "save it as UTF-8 TOML") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {exc}") from None
    for key, value in data.items():
        if not isinstance(value, dict):
            raise ConfigError(
                f"config file {str(p)!r}: top-level key {key!r} must be a [section]; "
                f"valid sections: {', '.join(_section_types())}"
            )
    return data


def _parse_value(text: str) -> Any:
    """TOML value syntax (`0.1`, `true`, `[3, 32, 32]`, `"x"`); bare words are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_overrides(items: Iterable[str]) -> Sections:
    """`["optim.lr=0.05", "model.args.hidden=64"]` -> nested dict (a third name part is a
    key of a table such as `model.args`)."""
    out: Sections = {}
    for item in items:
        key, sep, text = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not section or not name:
            raise ConfigError(
                f"override {item!r} must look like section.key=value, e.g. optim.lr=0.05"
            )
        table, dot, key = name.partition(".")
        if dot:
            out.setdefault(section, {}).setdefault(table, {})[key] = _parse_value(text.strip())
        else:
            out.setdefault(section, {})[name] = _parse_value(text.strip())
    return out


def merged(path: str | Path | None = None, *layers: Mapping[str, Mapping[str, Any]]) -> Sections:
    """The TOML file (if any), then each layer of overrides in order, as one set of
    sections (no defaults)."""
    sections: Sections = read_toml(path) if path else {}
    for layer in layers:
        sections = merge(sections, layer)
    return sections


def load_config(path: str | Path | None = None, *layers: Mapping[str, Mapping[str, Any]]) -> Config:
    """Defaults, then the TOML file (if any), then each layer of overrides in order."""
    return build_config(merged(path, *layers))


def to_dict(cfg: Config) -> Sections:
    """Plain nested dict (tuples become lists) suitable for TOML/JSON."""
    return {f.name: section_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def section_dict(section: Any) -> dict[str, Any]:
    """One config section as a plain dict (tuples become lists, nested sections dicts; an
    unset optional key is left out, as TOML has no null: reading it back leaves it unset)."""
    return {f.name: _plain(getattr(section, f.name)) for f in dataclasses.fields(section)
            if getattr(section, f.name) is not None}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return section_dict(value)
    return list(value) if isinstance(value, tuple) else value


def write_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(tomli_w.dumps(to_dict(cfg)))
