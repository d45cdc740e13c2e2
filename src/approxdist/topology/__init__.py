"""Where every rank sits: a mesh of named axes and the groups each rank needs; see
docs/architecture.md.

`Mesh` (pure data: build, validate, print, plan-file round trip) is what every parallel
mode runs on; `make_groups` (the only part that touches torch.distributed) creates its
process groups once, in the same order on every rank.
"""

from approxdist.topology.mesh import Axis, Mesh, TopologyError, check_cover, replica_counts
from approxdist.topology.place import AXES, Place
from approxdist.topology.plan import from_plan, to_plan
from approxdist.topology.text import check_world, parse_ints, parse_mesh, parse_replicas, render

__all__ = [
    "AXES", "Axis", "Mesh", "Place", "TopologyError", "check_cover", "check_world", "from_plan",
    "parse_ints", "parse_mesh", "parse_replicas", "render", "replica_counts", "to_plan",
]
