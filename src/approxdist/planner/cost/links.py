"""Alpha-beta-gamma link levels and the network a plan runs on (Hockney; Thakur et al. 2005).

A message of n bytes between two ranks costs `alpha + n beta` (Hockney's model: alpha the
start-up of one message, beta the seconds per byte); adding n fp32 bytes into a buffer
costs `n gamma` (Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication
Operations in MPICH", IJHPCA 2005). A `LinkLevel` holds the three coefficients of one
kind of link:

| level | between |
|---|---|
| `intra` | ranks of one node (shared memory, NVLink, a fast switch) |
| `inter` | ranks on different nodes |
| `loopback` | ranks sharing one machine's `cores` CPU cores over loopback (this machine) |

On `loopback` every cost is CPU work (copies through the kernel, additions, coding), so
with more busy ranks than cores each rank gets cores/ranks of a core: every term is
multiplied by `load(ranks) = max(1, ranks / cores)`. `from_link` gives the coefficients a
`LinkSpec` implies (alpha = latency, beta = 8 / bandwidth); `with_link` adds an emulated
link to a machine's own costs, as `bench allreduce --link` measures them, as separate
terms (`link_alpha_s`, `link_beta_s_per_byte`) that the load does not multiply: the
emulated link holds a message for its wire time on the clock, not on a core.
A `Network` says which level joins which ranks: `intra` inside a node of
`ranks_per_node` consecutive ranks, `inter` across nodes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from approxdist.comm.netem import LinkSpec, parse_link
from approxdist.errors import ConfigError

LEVELS = ("intra", "inter", "loopback")


@dataclass(frozen=True)
class LinkLevel:
    """alpha (s per message), beta (s per wire byte), gamma (s per fp32 byte added)."""

    name: str
    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float = 0.0
    cores: int | None = None  # loopback only: the CPU cores the ranks share
    #: an emulated link's latency and seconds per byte (`with_link`): wall-clock waits, not
    #: CPU work, so the load of shared cores does not stretch them
    link_alpha_s: float = 0.0
    link_beta_s_per_byte: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in LEVELS:
            raise ConfigError(f"link level {self.name!r} is not one of {', '.join(LEVELS)}")
        for key in ("alpha_s", "beta_s_per_byte", "gamma_s_per_byte", "link_alpha_s",
                    "link_beta_s_per_byte"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"link level {self.name!r} {key} = {value!r} must be a "
                                  f"finite number >= 0")
        if (self.name == "loopback") != (self.cores is not None):
            raise ConfigError(f"link level {self.name!r} cores = {self.cores!r}: give the "
                              f"shared cores for 'loopback' (e.g. cores=2) and only there")
        if self.cores is not None and (not isinstance(self.cores, int) or self.cores < 1):
            raise ConfigError(f"loopback cores = {self.cores!r} must be an integer >= 1")

    @classmethod
    def from_link(cls, name: str, link: LinkSpec | str, gamma_s_per_byte: float = 0.0,
                  cores: int | None = None) -> LinkLevel:
        """alpha = the link's latency, beta = 8 / its bandwidth in bit/s; gamma as given
        (a link spec says nothing about the CPU that adds)."""
        spec = _spec(link)
        return cls(name, spec.latency_s, 8.0 / spec.bandwidth_bps, gamma_s_per_byte, cores)

    def with_link(self, link: LinkSpec | str | None) -> LinkLevel:
        """These costs plus an emulated link's latency per message and 8/bandwidth per byte
        (kept apart: the link waits on the clock, whatever the cores' load)."""
        if link is None:
            return self
        spec = _spec(link)
        return replace(self, link_alpha_s=self.link_alpha_s + spec.latency_s,
                       link_beta_s_per_byte=self.link_beta_s_per_byte
                       + 8.0 / spec.bandwidth_bps)

    def load(self, ranks: int) -> float:
        """How many times slower CPU work runs with `ranks` busy ranks (1 off loopback)."""
        if self.cores is None:
            return 1.0
        return max(1.0, ranks / self.cores)

    def p2p_s(self, wire_bytes: float, ranks: int = 2) -> float:
        """One message of `wire_bytes`: (alpha + beta n) x load(ranks) + the link's
        latency + its seconds per byte x n."""
        return ((self.alpha_s + self.beta_s_per_byte * wire_bytes) * self.load(ranks)
                + self.link_alpha_s + self.link_beta_s_per_byte * wire_bytes)

    @property
    def beta_total(self) -> float:
        """Seconds per wire byte of the machine and its emulated link together."""
        return self.beta_s_per_byte + self.link_beta_s_per_byte

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """1 / (beta + the link's beta) (inf when both are 0)."""
        return math.inf if self.beta_total == 0 else 1.0 / self.beta_total


@dataclass(frozen=True)
class Network:
    """Levels by placement: ranks r and q share a node when r // ranks_per_node equals
    q // ranks_per_node; a network without `inter` is one node."""

    intra: LinkLevel
    inter: LinkLevel | None = None
    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        if (self.inter is None) != (self.ranks_per_node is None):
            raise ConfigError(f"a network with nodes needs both inter and ranks_per_node "
                              f"(got inter={self.inter!r}, ranks_per_node="
                              f"{self.ranks_per_node!r}); give both, or neither for one node")
        if self.ranks_per_node is not None and (not isinstance(self.ranks_per_node, int)
                                                or self.ranks_per_node < 1):
            raise ConfigError(f"ranks_per_node = {self.ranks_per_node!r} must be an integer >= 1")

    def node(self, rank: int) -> int:
        return 0 if self.ranks_per_node is None else rank // self.ranks_per_node

    def level(self, ranks: Iterable[int]) -> LinkLevel:
        """`inter` if the ranks span nodes, else `intra` (a ring is as slow as its slowest hop)."""
        nodes = {self.node(r) for r in ranks}
        return self.inter if len(nodes) > 1 and self.inter is not None else self.intra

    def busy(self, world_size: int) -> int:
        """Ranks of a `world_size` job that share one node's cores at most."""
        return world_size if self.ranks_per_node is None else min(world_size, self.ranks_per_node)

    def shared_cores(self, world_size: int) -> int | None:
        """The cores the ranks of a `world_size` job share where they outnumber them (a
        `loopback` level with `cores`), else None (each rank has a core of its own)."""
        cores = self.intra.cores
        return cores if cores is not None and self.busy(world_size) > cores else None

    def compute_load(self, world_size: int) -> float:
        """How many times slower a rank's CPU work runs when the ranks of a `world_size` job
        share one node's cores (processor sharing on a `loopback` level; 1 elsewhere)."""
        return self.intra.load(self.busy(world_size))


def _spec(link: LinkSpec | str) -> LinkSpec:
    if isinstance(link, LinkSpec):
        return link
    spec = parse_link(link)
    if spec is None:
        raise ConfigError(f"link {link!r} names no link; give one like bw=1gbit,lat=100us")
    return spec
