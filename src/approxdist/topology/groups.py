"""The one place that turns a mesh into torch.distributed groups (picotron's pattern).

`make_groups` is called by every rank with the same mesh and the same spans (a span is
a tuple of axis names: `("dp",)` a stage's replicas, `("pp", "dp")` the pipeline, `("tp",)`
a layer's shards); it creates every group of every span (`Mesh.spans`) in that fixed
order (torch.distributed's `new_group` is a collective over the whole world), keeps the
ones this rank belongs to, and hands them down as `MeshGroups`: `groups["dp"]`,
`groups["pp", "dp"]`. Engines receive their groups; they never create the mesh's groups
themselves. A group that is the whole world in rank order reuses the default process
group. The only module of `topology/` that touches torch.distributed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from approxdist.launch.context import DistContext
from approxdist.launch.group import Group, new_group, world_group
from approxdist.topology.mesh import Mesh
from approxdist.topology.place import WORDS, Place
from approxdist.topology.text import check_world

Span = tuple[str, ...]

#: the pipeline's span: every stage's every replica (with the same tensor-parallel shard)
PIPELINE: Span = ("pp", "dp")


@dataclass(frozen=True)
class MeshGroups:
    """This rank's place and its group along each span; a span not made (or of this rank
    alone) is a group of this rank only."""

    mesh: Mesh
    place: Place
    world: Group
    spans: Mapping[Span, Group] = field(default_factory=dict)

    def __getitem__(self, span: str | Span) -> Group:
        key = (span,) if isinstance(span, str) else tuple(span)
        group = self.spans.get(key)
        if group is not None:
            return group
        return Group((self.world.me,), self.world.me, name=_name(self.mesh, self.place, key))

    @property
    def replicas(self) -> Group:
        """This stage's replicas (gradient averaging)."""
        return self["dp"]

    @property
    def stage(self) -> Group:
        """The ranks that hold this rank's state (its stage's replicas, not its other
        tensor-parallel shards; a parameter server's whole world): the first of them
        writes that state's checkpoint."""
        return self[tuple(n for n in self.mesh.names if n not in ("pp", "tp"))]

    @property
    def pipeline(self) -> Group | None:
        """Every rank of the pipeline in row-major order (index = slot); None with one stage."""
        return self[PIPELINE] if self.mesh.num_stages > 1 else None

    def describe_rank(self, rank: int) -> str:
        return self.mesh.describe_rank(rank)


def default_spans(mesh: Mesh) -> list[Span]:
    """The groups every mode on `mesh` may need: along each axis but the roles, and the
    pipeline with several stages."""
    spans: list[Span] = [(a.name,) for a in mesh.axes
                         if a.name not in ("role", "pp") and a.extent > 1]
    if mesh.num_stages > 1:
        spans.append(PIPELINE)
    return spans


def make_groups(mesh: Mesh, ctx: DistContext, spans: Sequence[Span] | None = None,
                lanes: Mapping[Span, int] | None = None) -> MeshGroups:
    """Create every group of `spans` (default `default_spans`; a collective over the
    world); this rank's groups. `lanes[span]` is how many lanes each group of the span
    gets (its own and spares to fork: a data-parallel reducer with T threads forks T + 1,
    so needs T + 2); the world's are made when forked."""
    check_world(mesh, ctx.world_size)
    world = world_group(ctx)
    place = mesh.place(ctx.rank)
    mine: dict[Span, Group] = {}
    for span in (default_spans(mesh) if spans is None else spans):
        for ranks in mesh.spans(*span):
            if len(ranks) < 2:
                continue
            name = _name(mesh, mesh.place(ranks[0]), span)
            if ranks == world.ranks:
                group: Group | None = Group(world.ranks, ctx.rank, name=name,
                                            timeout_s=ctx.timeout_s)
            else:
                group = new_group(ctx, ranks, name, (lanes or {}).get(span, 1))
            if group is not None:
                mine[span] = group
    return MeshGroups(mesh, place, world, mine)


def _name(mesh: Mesh, place: Place, span: Span) -> str:
    """`"stage 1 replicas"`, `"pipeline"`, `"replica 0 shards"`, `"workers"`, for messages."""
    if span == PIPELINE:
        return "pipeline"
    if all(n in span for n in mesh.names if mesh.extent(n) > 1):
        return "world" if len(span) > 1 or place.role is not None else PLURALS[span[0]]
    if span == ("dp",) and place.role is not None:
        return f"{place.role}s"
    fixed = [f"{WORDS[n]} {place[n]}" for n in mesh.names
             if n not in span and n in WORDS and mesh.extent(n) > 1]
    return " ".join([*fixed, *(PLURALS[n] for n in span)])


PLURALS = {"pp": "stages", "dp": "replicas", "tp": "shards"}
