"""Ranks -> (stage, replica) and the groups each rank needs; see docs/architecture.md.

`Topology` (pure data: build, validate, print, plan-file round trip) is what every
parallel mode runs on; `make_groups` (the only part that touches torch.distributed)
creates its process groups once, in the same order on every rank.
"""

from approxdist.topology.layout import GroupSpec, Place, RankGroups, Topology, TopologyError
from approxdist.topology.plan import from_plan, to_plan
from approxdist.topology.text import parse_ints, parse_replicas, render

__all__ = [
    "GroupSpec", "Place", "RankGroups", "Topology", "TopologyError", "from_plan",
    "parse_ints", "parse_replicas", "render", "to_plan",
]
