"""One record per parallel mode, in one registry: everything the CLI, the checks and the
trainer need to know about a mode (torchtitan's `TrainSpec`).

A `Mode` says which mesh axes the mode runs on and how its mesh comes from the config
(`mesh`), which keys a partial config implies (`implied`: the world size from the
stages, `--stages` from `--world-size`, ...), which config keys it reads (`options`:
any other key set away from its default is refused, naming the key, so nothing is
silently ignored), its cross-section checks (`check`), its preflight with the model and
data in hand, the engine that runs it, and the kind of plan file it runs (`plan`, a row
of the planner's `planner.kinds`, so `train --plan` picks the mode). Rank names come
from the mesh. Nothing outside the records compares `train.parallel` with a mode's
name: adding a mode is one record and one engine (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import TYPE_CHECKING, Any

from approxdist.config.schema import Config
from approxdist.errors import ConfigError
from approxdist.planner.kinds import PlanKind, kind_of
from approxdist.registry import Registry
from approxdist.topology import Mesh, TopologyError, parse_mesh
from approxdist.topology.groups import Span, default_spans

if TYPE_CHECKING:
    from torch import nn

    from approxdist.data import TensorDataset
    from approxdist.train.engine import EngineBuilder

Sections = dict[str, dict[str, Any]]

#: config keys every mode reads (the run, the data, the model, the optimiser)
COMMON = ("train.*", "data.*", "model.*", "optim.*")


def _nothing(cfg: Config) -> None:
    """No checks beyond the common ones."""


def _no_preflight(cfg: Config, model: nn.Module, data: TensorDataset) -> None:
    """Nothing to check with the model and data in hand."""


def _as_given(sections: Sections) -> Sections:
    return sections


@dataclass(frozen=True)
class Mode:
    """A parallel mode: its mesh, its options, its checks and its engine."""

    name: str
    #: one line for `--parallel`'s help
    help: str
    #: the mesh axes it may run on
    axes: frozenset[str]
    #: its mesh from a checked config (pure)
    mesh: Callable[[Config], Mesh]
    #: the engine that runs it on one rank
    engine: EngineBuilder
    #: config keys it reads beyond `COMMON`: patterns (`"pipeline.*"`), `-key` excludes one
    options: tuple[str, ...] = ()
    #: keys a partial config implies (on the merged layers, before defaults)
    implied: Callable[[Sections], Sections] = _as_given
    #: cross-section rules and the parts its config names (one `ConfigError` line)
    check: Callable[[Config], None] = _nothing
    #: checks needing the model and the data (`approxdist train`'s preflight)
    preflight: Callable[[Config, nn.Module, TensorDataset], None] = _no_preflight
    #: the ranks that share each global batch (None: each rank draws the whole batch)
    batch_share: Callable[[Config], int | None] = lambda cfg: cfg.train.world_size
    #: what those ranks are called in messages
    share_name: str = "world size"
    #: why the mode cannot follow a batch that grows between epochs (None: it can)
    fixed_steps: Callable[[Config], str | None] = lambda cfg: None
    #: flags that set another key in this mode (`--codec` -> wire.push.codec): flag -> key
    flag_keys: Mapping[str, str] = field(default_factory=dict)
    #: the process groups its engine needs, from its mesh
    spans: Callable[[Mesh], list[Span]] = default_spans
    #: the kind of plan file it runs (`train --plan`; the planner's table, whose kinds
    #: are disjoint by the axes of size > 1 they use); None: no plan describes the mode
    plan: PlanKind | None = None

    def reads(self, key: str) -> bool:
        """Whether this mode reads config key `section.name`."""
        patterns = (*COMMON, *self.options)
        if any(p.startswith("-") and fnmatch(key, p[1:]) for p in patterns):
            return False
        return any(fnmatch(key, p) for p in patterns if not p.startswith("-"))


MODES: Registry[Mode] = Registry("parallel mode", ConfigError)


def register(mode: Mode) -> Mode:
    MODES.add(mode.name, mode)
    return mode


def modes() -> Registry[Mode]:
    """The registry with every mode's record in it (`train/modes/` registers them)."""
    import approxdist.train.modes  # noqa: F401  (registers the records)

    return MODES


def mode_of(cfg: Config) -> Mode:
    """The record of `cfg`'s `train.parallel` (an unknown name lists the valid ones)."""
    return modes().get(cfg.train.parallel)


def plan_mode(mesh: Mesh) -> Mode:
    """The record of the mode that runs a plan file's `mesh` (one `ConfigError` line if
    none does)."""
    kind = kind_of(mesh.used)
    found = [m for m in map(modes().get, modes().names()) if kind is not None and m.plan == kind]
    if len(found) != 1:
        runs = " and ".join(m.name for m in found) or "no mode"
        raise ConfigError(f"a plan of mesh {mesh.spec} ({mesh.kind}) is run by {runs}; "
                          f"give a plan of stages with replicas (and tp), or pass --parallel")
    return found[0]


def mesh_of(cfg: Config) -> Mesh:
    """The run's mesh (`train.mesh` when given, checked against the mode's own keys)."""
    return mode_of(cfg).mesh(cfg)


def given_mesh(cfg: Config, mode: Mode) -> Mesh | None:
    """`train.mesh` parsed and checked against the axes `mode` runs on (None: not given)."""
    if not cfg.train.mesh:
        return None
    mesh = parse_mesh(cfg.train.mesh)
    check_axes(mesh, mode)
    return mesh


def check_axes(mesh: Mesh, mode: Mode) -> None:
    extra = [a.text() for a in mesh.axes if a.name not in mode.axes and a.extent > 1]
    if extra:
        runs = [m.name for m in map(modes().get, modes().names())
                if all(a.split("=")[0] in m.axes for a in extra)]
        raise TopologyError(
            f"--parallel {mode.name} runs on axes {', '.join(sorted(mode.axes))}, not "
            f"{', '.join(extra)} (mesh {mesh.spec}); drop the axis"
            + (f" or use --parallel {' or '.join(runs)}" if runs else ""))


def agree(key: str, given: Any, from_mesh: Any, mesh: Mesh) -> None:
    """A key set beside `--mesh` must say what the mesh says."""
    if given is not None and given != from_mesh:
        raise TopologyError(f"{key} = {given!r} but the mesh {mesh.spec} says {from_mesh!r}; "
                            f"give one of the two, or make them agree")


def implied_by_mesh(sections: Sections, derive: Callable[[Mesh], Sections]) -> Sections:
    """`sections` with the keys `derive` reads off `train.mesh` (when given), refusing a
    given key that disagrees."""
    text = sections.get("train", {}).get("mesh")
    if not text:
        return sections
    mesh = parse_mesh(text)
    out = {k: dict(v) for k, v in sections.items()}
    for section, values in derive(mesh).items():
        for key, value in values.items():
            agree(f"{section}.{key}", out.get(section, {}).get(key), value, mesh)
            out.setdefault(section, {})[key] = value
    return out


def unused_options(cfg: Config, mode: Mode) -> list[tuple[str, Any]]:
    """The keys set away from their defaults that `mode` does not read (a nested section's
    keys one by one: `wire.grad.codec`)."""
    return [(key, value) for key, value, default in _keys(cfg, Config(), "")
            if value != default and not mode.reads(key)]


def _keys(mine: Any, base: Any, prefix: str) -> list[tuple[str, Any, Any]]:
    out = []
    for f in dataclasses.fields(mine):
        value, default = getattr(mine, f.name), getattr(base, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += _keys(value, default, key + ".")
        else:
            out.append((key, value, default))
    return out


def check_options(cfg: Config, flag_of: Mapping[str, str] | None = None) -> None:
    """Refuse, in one line, a key `cfg`'s mode would ignore; `flag_of` names the flag that
    sets a key (`approxdist train`'s), for the message."""
    mode = mode_of(cfg)
    unused = unused_options(cfg, mode)
    if not unused:
        return
    key, value = unused[0]
    flag = (flag_of or {}).get(key)
    users = [m for m in modes().names() if modes().get(m).reads(key)]
    set_by = f" ({flag})" if flag else ""
    fix = f"drop it, or use --parallel {' or '.join(users)}" if users else "drop it"
    raise ConfigError(f"{key} = {value!r}{set_by} is not used by --parallel {mode.name}; {fix}")


def check_mode(cfg: Config, flag_of: Mapping[str, str] | None = None) -> Mode:
    """The mode's record after its checks: the options it reads, its mesh against the
    world, its batch share and its own rules."""
    from approxdist.topology import check_world

    mode = mode_of(cfg)
    check_options(cfg, flag_of)
    mode.check(cfg)
    check_world(mode.mesh(cfg), cfg.train.world_size)
    share = mode.batch_share(cfg)
    if share and cfg.data.batch_size % share:
        lo = cfg.data.batch_size - cfg.data.batch_size % share
        hint = f"try {lo}" if lo else f"try {share}"
        raise ConfigError(
            f"data.batch_size ({cfg.data.batch_size}) must be divisible by the "
            f"{mode.share_name} ({share}) so every rank gets the same share; {hint} or "
            f"{lo + share}")
    return mode


def mode_names() -> Sequence[str]:
    return modes().names()
