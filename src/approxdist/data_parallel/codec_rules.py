"""Per-parameter wire formats: name patterns or module types -> codec spec (seed 004).

Seed 004's benchmark sends convolution gradients as fp8, fully-connected ones as Table-1
and biases as float. A `CodecRules` says that in one list of `pattern=spec` strings,
checked in order, the first match winning, the default codec otherwise:

    CodecRules.parse(["type:Conv2d.weight=fp8-e5m2", "type:Linear.weight=table2",
                      "*.bias=fp32"], default="fp32")

Patterns:
* `type:<Module>` or `type:<Module>.<attr>`: parameters owned directly by a module of that
  class (its `__name__`, e.g. `Conv2d`, `Linear`, `BatchNorm2d`), optionally only the one
  attribute (`weight`, `bias`);
* anything else is an `fnmatch` glob on the parameter's full name (`*.bias`, `0.*`,
  `layer3.*.conv?.weight`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from torch import nn

from approxdist.errors import ConfigError

RULE_FORMS = "PATTERN=CODEC with PATTERN a name glob (*.bias) or type:Module[.attr] (type:Conv2d.weight)"


@dataclass(frozen=True)
class Rule:
    """One `pattern=spec` rule."""

    pattern: str
    codec: str

    def matches(self, name: str, owner: nn.Module) -> bool:
        if self.pattern.startswith("type:"):
            kind, _, attr = self.pattern[5:].partition(".")
            leaf = name.rsplit(".", 1)[-1]
            return type(owner).__name__ == kind and (not attr or attr == leaf)
        return fnmatch.fnmatchcase(name, self.pattern)


@dataclass(frozen=True)
class CodecRules:
    """Ordered rules plus the default codec; `codec_for(name, owner)` picks one spec."""

    rules: tuple[Rule, ...] = ()
    default: str = "fp32"

    @staticmethod
    def parse(items: Iterable[str] | Mapping[str, str] | None, default: str = "fp32") -> CodecRules:
        """Rules from `["pattern=spec", ...]` or `{pattern: spec}` (order kept)."""
        if items is None:
            return CodecRules((), default)
        pairs = list(items.items()) if isinstance(items, Mapping) else [_split(s) for s in items]
        rules = tuple(Rule(p.strip(), c.strip()) for p, c in pairs)
        for rule in rules:
            if not rule.pattern or not rule.codec or rule.pattern == "type:":
                raise ConfigError(f"codec rule {rule.pattern}={rule.codec!r} is incomplete; "
                                  f"write {RULE_FORMS}")
        return CodecRules(rules, default)

    def codec_for(self, name: str, owner: nn.Module) -> str:
        for rule in self.rules:
            if rule.matches(name, owner):
                return rule.codec
        return self.default

    def specs(self) -> list[str]:
        """Every codec spec these rules can produce (default first)."""
        out = [self.default]
        out += [r.codec for r in self.rules if r.codec not in out]
        return out

    def validate(self) -> None:
        """Build each codec once so a bad spec fails here with the codec registry's message."""
        from approxdist.comm.codecs import get_codec

        for spec in self.specs():
            get_codec(spec)


def _split(item: str) -> tuple[str, str]:
    pattern, sep, codec = item.rpartition("=")
    if not sep:
        raise ConfigError(f"codec rule {item!r} has no '='; write {RULE_FORMS}")
    return pattern, codec


def param_owners(module: nn.Module) -> dict[str, nn.Module]:
    """Full parameter name -> the module that registers it directly."""
    owners: dict[str, nn.Module] = {}
    for mod_name, mod in module.named_modules():
        for pname, _ in mod.named_parameters(recurse=False):
            owners[f"{mod_name}.{pname}" if mod_name else pname] = mod
    return owners
