"""The one place that turns a topology into torch.distributed groups (picotron's pattern).

`make_groups` is called by every rank with the same topology; it creates every sub-group
of `Topology.group_specs()` in that fixed order (torch.distributed's `new_group` is a
collective over the whole world), keeps the ones this rank belongs to, and hands them
down as a `TopologyGroups`: the engines receive their groups, they never create the
topology's groups themselves. A group that is the whole world in rank order reuses the
default process group. The only module of `topology/` that touches torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass

from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, new_group, world_group
from approxdist.topology.layout import Place, Topology, TopologyError


@dataclass(frozen=True)
class TopologyGroups:
    """This rank's place and groups; `pipeline` (every rank in stage-major order) is None
    with one stage."""

    topology: Topology
    place: Place
    world: Group
    replicas: Group
    pipeline: Group | None

    def describe_rank(self, rank: int) -> str:
        return self.topology.describe_rank(rank)


def check_world(topology: Topology, world_size: int) -> None:
    """The topology must cover exactly the job's ranks."""
    if topology.world_size != world_size:
        raise TopologyError(
            f"the topology (stages {topology.num_stages}, replicas "
            f"{','.join(map(str, topology.replicas))}) places {topology.world_size} rank(s) but "
            f"the job has {world_size}; start {topology.world_size} workers (--world-size "
            f"{topology.world_size}) or change the topology (--stages, --replicas, --placement)")


def make_groups(topology: Topology, ctx: DistContext, replica_streams: int = 1) -> TopologyGroups:
    """Create every sub-group of `topology` (collective over the world); this rank's groups.

    A stage's replica group gets `replica_streams` streams (its own and spares to fork:
    a data-parallel engine with T threads forks T + 1, so needs T + 2); the world's are
    made when forked.
    """
    check_world(topology, ctx.world_size)
    world = world_group(ctx)
    mine: dict[str, Group] = {}
    for spec in topology.group_specs():
        streams = replica_streams if spec.name.endswith("replicas") else 1
        if spec.ranks == world.ranks:
            group: Group | None = Group(world.ranks, ctx.rank, name=spec.name)
        else:
            group = new_group(ctx, spec.ranks, spec.name, streams)
        if group is not None:
            mine[spec.name] = group
    place = topology.place(ctx.rank)
    replicas = mine.get(f"stage {place.stage} replicas") or \
        Group((ctx.rank,), ctx.rank, name=f"stage {place.stage} replicas")
    pipeline = mine.get("pipeline")
    return TopologyGroups(topology, place, world, replicas, pipeline)
