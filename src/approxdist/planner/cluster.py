"""The cluster a plan is for: ranks, nodes and the link at each level, as `approxdist plan` takes them.

    ClusterSpec(world_size=4, link="bw=8gbit")                       # one level joins all ranks
    ClusterSpec(nodes=2, per_node=4, intra="bw=100gbit", inter="bw=10gbit,lat=5us")
    ClusterSpec(world_size=2, calibration=cal)                       # this machine's loopback

`network()` gives the cost model's `Network` (a link spec per level, docs/collectives.md; with a
cost calibration that holds `loopback`, a `--link` is added to the machine's own costs,
as `bench allreduce --link` measures them); `pipedream_levels()` the bandwidths
PipeDream's optimizer takes (`-n g n -b B_intra B_inter`); `to_json()` the plan file's
`link` entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from approxdist.errors import ConfigError
from approxdist.planner.cost.calibration_file import CostCalibration
from approxdist.planner.cost.codecs import CodecCost
from approxdist.planner.cost.links import LinkLevel, Network
from approxdist.planner.pipedream_optimizer import Level


@dataclass(frozen=True)
class ClusterSpec:
    """Ranks (`world_size`, or `nodes` x `per_node`) and their links."""

    world_size: int | None = None
    nodes: int | None = None
    per_node: int | None = None
    link: str | None = None
    intra: str | None = None
    inter: str | None = None
    calibration: CostCalibration | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "world_size", _world(self.nodes, self.per_node,
                                                       self.world_size))
        if self.link and (self.intra or self.inter):
            raise ConfigError("give --link SPEC (one level for all ranks) or --intra SPEC "
                              "--inter SPEC (two levels), not both")
        if bool(self.intra) != bool(self.inter):
            raise ConfigError(f"give --intra and --inter together (got intra={self.intra!r}, "
                              f"inter={self.inter!r}), or one --link for every rank")
        if self.inter and self.per_node is None:
            raise ConfigError("--intra/--inter need --nodes n --per-node g to say which ranks "
                              "share a node")
        if not (self.link or self.inter or self.calibration is not None):
            raise ConfigError("say what joins the ranks: --link bw=10gbit,lat=5us (one "
                              "level), --intra SPEC --inter SPEC with --nodes/--per-node, or "
                              "--calibration FILE (this machine's fitted loopback)")

    @property
    def ranks(self) -> int:
        assert self.world_size is not None  # set in __post_init__
        return self.world_size

    def network(self) -> Network:
        if self.inter and self.intra:
            return Network(LinkLevel.from_link("intra", self.intra),
                           LinkLevel.from_link("inter", self.inter), self.per_node)
        machine = self._machine_level()
        if machine is not None:
            return Network(machine.with_link(self.link))
        assert self.link is not None
        return Network(LinkLevel.from_link("inter", self.link))

    def codec(self, spec: str) -> CodecCost:
        """`spec`'s costs: measured in the calibration, else the defaults."""
        return self.calibration.codec(spec) if self.calibration else CodecCost.of(spec)

    def pipedream_levels(self) -> tuple[Level, ...]:
        """PipeDream's levels: workers and bytes/s, innermost first."""
        net = self.network()
        if net.inter is not None and self.nodes is not None and self.per_node is not None:
            return (Level(self.per_node, _bandwidth(net.intra)),
                    Level(self.nodes, _bandwidth(net.inter)))
        return (Level(self.ranks, _bandwidth(net.intra)),)

    def describe(self) -> str:
        if self.inter:
            return (f"{self.nodes} node(s) x {self.per_node} rank(s), intra {self.intra}, "
                    f"inter {self.inter}")
        machine = self._machine_level()
        where = f"this machine's {machine.name} (calibrated)" if machine is not None else ""
        link = f"link {self.link}" if self.link else ""
        return f"{self.ranks} rank(s), " + " + ".join(x for x in (where, link) if x)

    def to_json(self) -> dict[str, Any]:
        machine = self._machine_level()
        return {"link": self.link, "intra": self.intra, "inter": self.inter,
                "nodes": self.nodes, "per_node": self.per_node,
                "calibrated_level": machine.name if machine is not None else None}

    def _machine_level(self) -> LinkLevel | None:
        """The calibration's loopback (or intra) level, when it gives one and no --intra."""
        if self.calibration is None or self.inter:
            return None
        for name in ("loopback", "intra"):
            if name in self.calibration.levels:
                return self.calibration.levels[name]
        if self.link:
            return None
        raise ConfigError(f"the calibration has no 'loopback' or 'intra' level (it has "
                          f"{', '.join(sorted(self.calibration.levels)) or 'none'}); give "
                          f"--link SPEC")


def _world(nodes: int | None, per_node: int | None, world_size: int | None) -> int:
    """The world size the flags describe; `ConfigError` if nodes x per-node cannot form it."""
    for name, value in (("--nodes", nodes), ("--per-node", per_node),
                        ("--world-size", world_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ConfigError(f"{name} {value!r} must be an integer >= 1")
    if (nodes is None) != (per_node is None):
        raise ConfigError(f"give --nodes and --per-node together (got nodes={nodes}, "
                          f"per-node={per_node})")
    if nodes is not None and per_node is not None:
        if world_size is not None and world_size != nodes * per_node:
            raise ConfigError(f"--world-size {world_size} cannot be formed by --nodes {nodes} "
                              f"x --per-node {per_node} = {nodes * per_node}; use --world-size "
                              f"{nodes * per_node} or change the nodes")
        return nodes * per_node
    if world_size is None:
        raise ConfigError("give --world-size N (or --nodes n --per-node g)")
    return world_size


def _bandwidth(level: LinkLevel) -> float:
    bw = level.bandwidth_bytes_per_s
    if bw == float("inf"):
        raise ConfigError(f"link level {level.name!r} has no bandwidth (beta = 0); PipeDream's "
                          f"objective needs one: give --link bw=...")
    return bw
