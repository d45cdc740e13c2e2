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

Named policies: the item `policy:<name>` stands for that policy's rules, in its place
(`POLICIES`; docs/adaprec.md):
* `seed004`: seed 004's benchmark rule: fp32 for biases and normalisation layers,
  fp8-e5m2 for convolution weights, Table-1 for fully-connected weights;
* `fastest`: `*=fastest`, seed 004's Fastest.
The codec `fastest` is resolved per *bucket*, once the buckets are planned: the codec
with the lowest measured all-reduce time for the bucket's size (`resolve`, from the
`CodecTimes` of `codec_times.py`; without them `validate` says how to measure them).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from torch import nn

from approxdist.data_parallel.codec_times import MEASURE, CodecTimes
from approxdist.errors import ConfigError, SpecError
from approxdist.registry import Registry

RULE_FORMS = ("PATTERN=CODEC with PATTERN a name glob (*.bias) or type:Module[.attr] "
              "(type:Conv2d.weight), or policy:NAME (policy:seed004)")
#: the pseudo-codec resolved per bucket to the fastest measured codec for its size
FASTEST = "fastest"
_NORMS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LayerNorm", "GroupNorm")
_CONVS = ("Conv1d", "Conv2d", "Conv3d")

POLICIES: Registry[tuple[str, ...]] = Registry("codec policy", ConfigError)
POLICIES.add("seed004", ("*.bias=fp32", *(f"type:{n}=fp32" for n in _NORMS),
                         *(f"type:{c}.weight=fp8-e5m2" for c in _CONVS), "type:Linear.weight=table1"))
POLICIES.add("fastest", (f"*={FASTEST}",))


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
    """Ordered rules plus the default codec; `codec_for(name, owner)` picks one spec, and
    `resolve(spec, nbytes)` turns `fastest` into a codec for a bucket of that size."""

    rules: tuple[Rule, ...] = ()
    default: str = "fp32"
    times: CodecTimes | None = None

    @staticmethod
    def parse(items: Iterable[str] | Mapping[str, str] | None, default: str = "fp32",
              times: CodecTimes | None = None) -> CodecRules:
        """Rules from `["pattern=spec", "policy:name", ...]` or `{pattern: spec}` (order kept)."""
        if items is None:
            return CodecRules((), default, times)
        pairs = list(items.items()) if isinstance(items, Mapping) else \
            [_split(r) for item in items for r in _expand(item)]
        rules = tuple(Rule(p.strip(), c.strip()) for p, c in pairs)
        for rule in rules:
            if not rule.pattern or not rule.codec or rule.pattern == "type:":
                raise ConfigError(f"codec rule {rule.pattern}={rule.codec!r} is incomplete; "
                                  f"write {RULE_FORMS}")
        return CodecRules(rules, default, times)

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

    def resolve(self, spec: str, nbytes: int) -> str:
        """The codec a bucket of `nbytes` fp32 bytes travels in: `spec`, or for `fastest` the
        fastest measured codec at that size."""
        if spec != FASTEST:
            return spec
        return self._times().fastest(nbytes)

    def _times(self) -> CodecTimes:
        if self.times is None:
            raise ConfigError(f"codec {FASTEST!r} picks per bucket from measured all-reduce "
                              f"times: pass --codec-times FILE (wire.grad.times), written by "
                              + MEASURE.format(alg="auto", path="FILE"))
        return self.times

    def validate(self, algorithm: str = "auto") -> None:
        """Build each codec once so a bad spec fails here with the codec registry's message;
        a compressor (docs/compressors.md) must be valid, and all-reduce compatible unless
        the all-reduce `algorithm` has an all-gather beside it."""
        from approxdist.comm.codecs import get_codec
        from approxdist.comm.compressors import is_compressor
        from approxdist.comm.compressors.spec import compressor_forms
        from approxdist.data_parallel.compressed import check_carried

        for spec in self.specs():
            for codec in self._times().codecs if spec == FASTEST else [spec]:
                if is_compressor(codec):
                    check_carried(codec, algorithm)
                    continue
                try:
                    get_codec(codec)
                except SpecError as exc:
                    raise SpecError(f"{' '.join(str(exc).split())}; or a compressor: "
                                    f"{', '.join(compressor_forms())}") from None


def _expand(item: str) -> tuple[str, ...]:
    """`policy:NAME` -> that policy's rules; any other item -> itself."""
    if item.strip().startswith("policy:"):
        return POLICIES.get(item.strip()[len("policy:"):])
    return (item,)


def _split(item: str) -> tuple[str, str]:
    pattern, sep, codec = item.rpartition("=")
    if not sep:
        raise ConfigError(f"codec rule {item!r} has no '='; write {RULE_FORMS}")
    return pattern, codec


def unmatched(items: Iterable[str], module: nn.Module) -> list[str]:
    """The rules written in `items` (not those a policy stands for: a policy covers every
    kind of layer) that match no parameter of `module`: a typo that would silently send
    the default codec instead."""
    owners = param_owners(module)
    out = []
    for item in items:
        if item.strip().startswith("policy:"):
            continue
        pattern, codec = _split(item)
        rule = Rule(pattern.strip(), codec.strip())
        if not any(rule.matches(n, o) for n, o in owners.items()):
            out.append(item)
    return out


def param_owners(module: nn.Module) -> dict[str, nn.Module]:
    """Full parameter name -> the module that registers it directly."""
    owners: dict[str, nn.Module] = {}
    for mod_name, mod in module.named_modules():
        for pname, _ in mod.named_parameters(recurse=False):
            owners[f"{mod_name}.{pname}" if mod_name else pname] = mod
    return owners
