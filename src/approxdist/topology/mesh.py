"""A mesh of named axes: the one description of where every rank sits, for every mode (pure).

A mesh names its axes (`pp` pipeline stages, `dp` data-parallel replicas, `tp`
tensor-parallel shards, `role` a parameter server's servers and workers) and their sizes;
their product is the world. Axes nest in one fixed order, outermost first (`AXES`), and
ranks are laid out row-major, the innermost axis varying fastest: `tp` shards of one
replica sit on neighbouring ranks (they exchange the most, Megatron's order), then a
stage's replicas, then the stages (torchtitan's `ParallelDims`, picotron's grid). An
inner axis may be *ragged*: one size per index of the outermost axis, as seed 002's
AlexNet runs a convolution stage on 3 ranks and a fully-connected stage on 1
(`pp=2,dp=3/1`), or a parameter server holds its shards on S ranks and computes on W
(`role=2,dp=S/W`). A placement names the global rank of every point in row-major order
(torch.distributed.pipelining's `stage_index_to_group_rank`), so stages and replicas can
go on any ranks. From the mesh each rank learns its place and the ranks along any axes
(`along`); `topology.groups.make_groups` turns those into process groups, once, in the
same order on every rank. No torch.distributed here.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from approxdist.errors import ConfigError
from approxdist.topology.place import AXES, Place


class TopologyError(ConfigError):
    """A mesh or placement that cannot be: ranks missing or repeated, bad axes or sizes."""


Sizes = int | Sequence[int]


@dataclass(frozen=True)
class Axis:
    """One named axis: one size, or one size per index of the mesh's outermost axis."""

    name: str
    sizes: tuple[int, ...]

    @property
    def ragged(self) -> bool:
        return len(self.sizes) > 1

    @property
    def extent(self) -> int:
        return max(self.sizes)

    def text(self) -> str:
        return f"{self.name}={'/'.join(map(str, self.sizes))}"


@dataclass(frozen=True)
class Mesh:
    """Named axes (outermost first) and the global rank of each point, row-major."""

    axes: tuple[Axis, ...]
    placement: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        _check_axes(self.axes)
        n = len(self.points)
        if self.placement:
            order = list(self.placement)
            if len(order) != n:
                raise TopologyError(
                    f"placement {order} names {len(order)} rank(s) but the mesh "
                    f"{self.spec} has {n} point(s); give one rank per point, in row-major "
                    f"order ({' then '.join(a.name for a in self.axes)})")
            check_cover(order, "placement")

    # -- constructors ----------------------------------------------------------------------
    @classmethod
    def of(cls, sizes: Mapping[str, Sizes], placement: Sequence[int] | None = None) -> Mesh:
        """`Mesh.of({"pp": 2, "dp": [3, 1]})`: the axes in any order, put in `AXES` order;
        axes of size 1 are kept (a mode may need to name them)."""
        unknown = [name for name in sizes if name not in AXES]
        if unknown:
            raise TopologyError(f"mesh axis {unknown[0]!r} is not one of: {', '.join(AXES)} "
                                f"({'; '.join(f'{k}: {v}' for k, v in AXES.items())})")
        axes = [Axis(name, _sizes(name, sizes[name])) for name in AXES if name in sizes]
        for i, a in enumerate(axes[1:], 1):  # a ragged axis of equal sizes is a plain one
            if len(a.sizes) == axes[0].extent and len(set(a.sizes)) == 1:
                axes[i] = Axis(a.name, a.sizes[:1])
        return cls(tuple(axes), tuple(int(r) for r in placement) if placement else ())

    @classmethod
    def single(cls) -> Mesh:
        return cls.of({"dp": 1})

    @classmethod
    def data_parallel(cls, world_size: int) -> Mesh:
        """Every rank a replica of the whole model."""
        return cls.of({"dp": world_size})

    @classmethod
    def stages(cls, stages: int, replicas: Sizes = 1,
               placement: Sequence[int] | None = None, tp: int = 1) -> Mesh:
        """`stages` pipeline stages with `replicas` ranks each (one count, or one per stage),
        a stage's replicas on neighbouring ranks unless `placement` says otherwise; with
        `tp` > 1 each of those is `tp` neighbouring ranks splitting the stage's layers."""
        if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
            raise TopologyError(f"stages ({stages!r}) must be an integer >= 1")
        counts = replica_counts(stages, replicas)
        return cls.of({"pp": stages, "dp": counts, **({"tp": tp} if tp > 1 else {})},
                      placement)

    @classmethod
    def pipeline(cls, stages: int, placement: Sequence[int] | None = None) -> Mesh:
        """One rank per stage; stage s on `placement[s]` (default rank s)."""
        return cls.stages(stages, 1, placement)

    @classmethod
    def roles(cls, servers: int, workers: int, placement: Sequence[int] | None = None) -> Mesh:
        """A parameter server: `servers` ranks holding the parameter shards, then `workers`
        ranks computing gradients (role 0 = servers, role 1 = workers)."""
        for what, n, does, e in (("servers", servers, "holding the parameters", 1),
                                 ("workers", workers, "computing gradients", 2)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise TopologyError(f"--{what} {n} must be >= 1 (the ranks {does}); "
                                    f"e.g. --{what} {e}")
        return cls.of({"role": 2, "dp": (servers, workers)}, placement)

    # -- shape -------------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    def axis(self, name: str) -> Axis | None:
        return next((a for a in self.axes if a.name == name), None)

    def extent(self, name: str) -> int:
        """The axis's size (the largest, when ragged); 1 for an axis the mesh lacks."""
        a = self.axis(name)
        return a.extent if a is not None else 1

    def sizes(self, name: str) -> tuple[int, ...]:
        """The axis's size at each index of the outermost axis (one entry when not ragged)."""
        a = self.axis(name)
        return a.sizes if a is not None else (1,)

    @property
    def spec(self) -> str:
        """`pp=2,dp=3/1`: the text `Mesh.parse` reads back (`topology.spec`)."""
        return ",".join(a.text() for a in self.axes)

    @cached_property
    def points(self) -> tuple[tuple[int, ...], ...]:
        """Every point's coordinates (one per axis), row-major: the slot order."""
        outer, rest = self.axes[0], self.axes[1:]
        out: list[tuple[int, ...]] = []
        for i in range(outer.extent):
            ranges = [range(a.sizes[i] if a.ragged else a.sizes[0]) for a in rest]
            out += [(i, *inner) for inner in itertools.product(*ranges)]
        return tuple(out)

    @property
    def world_size(self) -> int:
        return len(self.points)

    @cached_property
    def ranks(self) -> tuple[int, ...]:
        """The global rank at each slot."""
        return self.placement or tuple(range(self.world_size))

    @cached_property
    def _slot_of(self) -> dict[int, int]:
        return {r: s for s, r in enumerate(self.ranks)}

    # -- places --------------------------------------------------------------------------------
    def slot(self, rank: int) -> int:
        """`rank`'s position in row-major order: what seeds per-rank randomness, so a run's
        numbers do not depend on its placement."""
        s = self._slot_of.get(rank)
        if s is None:
            raise TopologyError(f"rank {rank} is not in this mesh of {self.world_size} ranks "
                                f"(0..{self.world_size - 1})")
        return s

    def place(self, rank: int) -> Place:
        return Place(tuple(zip(self.names, self.points[self.slot(rank)])))

    def rank_at(self, **coords: int) -> int:
        """The rank at `coords` (axes left out are 0)."""
        want = tuple(coords.get(n, 0) for n in self.names)
        try:
            return self.ranks[self.points.index(want)]
        except ValueError:
            raise TopologyError(f"the mesh {self.spec} has no point {coords}") from None

    def describe_rank(self, rank: int) -> str:
        """`"rank 3 (stage 1, replica 0)"`, `"worker 1 (rank 2)"`, for messages."""
        place = self.place(rank)
        if "role" in self.names:
            return f"{place} (rank {rank})"
        return f"rank {rank} ({place})"

    def along(self, rank: int, *axes: str) -> tuple[int, ...]:
        """The ranks whose points agree with `rank`'s on every axis but `axes`, row-major:
        `along(r, "dp")` its stage's replicas, `along(r, "pp", "dp")` its pipeline."""
        return self._span_of(self.slot(rank), axes)

    def spans(self, *axes: str) -> list[tuple[int, ...]]:
        """Every distinct `along(_, *axes)`, in the order of their first slot."""
        seen: dict[tuple[int, ...], None] = {}
        for slot in range(self.world_size):
            seen.setdefault(self._span_of(slot, axes), None)
        return list(seen)

    def _span_of(self, slot: int, axes: Sequence[str]) -> tuple[int, ...]:
        keep = [i for i, n in enumerate(self.names) if n not in axes]
        here = self.points[slot]
        return tuple(self.ranks[s] for s, p in enumerate(self.points)
                     if all(p[i] == here[i] for i in keep))

    # -- the pipeline's view ---------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return self.extent("pp")

    @property
    def replicas(self) -> tuple[int, ...]:
        """Replica count (`dp`) of each stage."""
        dp = self.sizes("dp")
        return dp if len(dp) == self.num_stages else dp * self.num_stages

    @property
    def stage_ranks(self) -> tuple[tuple[int, ...], ...]:
        """The ranks of each stage, row-major (replica-major when sharded by `tp` too)."""
        return tuple(self.spans(*(n for n in self.names if n != "pp")))

    @property
    def equal(self) -> bool:
        """Every stage has the same number of replicas (a PP x DP grid)."""
        return len(set(self.replicas)) == 1

    @property
    def used(self) -> frozenset[str]:
        """The names of the axes of size > 1 (an axis of size 1 places nothing)."""
        return frozenset(a.name for a in self.axes if a.extent > 1)

    @property
    def kind(self) -> str:
        """"single", "data-parallel", "pipeline", "hybrid", "tensor-parallel",
        "parameter server", or the axes of size > 1 joined by " x "."""
        if "role" in self.names:
            return "parameter server"
        used = tuple(a.name for a in self.axes if a.name in self.used)
        named = {(): "single", ("dp",): "data-parallel", ("pp",): "pipeline",
                 ("pp", "dp"): "hybrid", ("tp",): "tensor-parallel"}
        return named.get(used, " x ".join(used))


def replica_counts(stages: int, replicas: Sizes) -> tuple[int, ...]:
    """One replica count per stage from one number or a list; `TopologyError` if impossible."""
    counts = (replicas,) * stages if isinstance(replicas, int) else tuple(replicas)
    if len(counts) == 1:
        counts = counts * stages
    if len(counts) != stages:
        raise TopologyError(f"replicas {','.join(map(str, counts))} give {len(counts)} counts for "
                            f"{stages} stages; give one count per stage or one for all")
    for s, n in enumerate(counts):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise TopologyError(f"stage {s} has {n} replicas; every stage needs at least one "
                                f"rank (e.g. --replicas 2,1)")
    return counts


def check_cover(ranks: Sequence[int], what: str) -> None:
    """`ranks` must be 0..n-1, each exactly once."""
    n = len(ranks)
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    outside = sorted({r for r in ranks if not 0 <= r < n})
    missing = sorted(set(range(n)) - set(ranks))
    if not (twice or outside or missing):
        return
    problems = []
    if twice:
        problems.append(f"rank(s) {', '.join(map(str, twice))} more than once")
    if outside:
        problems.append(f"rank(s) {', '.join(map(str, outside))} outside 0..{n - 1}")
    if missing:
        problems.append(f"rank(s) {', '.join(map(str, missing))} nowhere")
    raise TopologyError(f"{what} {list(ranks)} must name every rank of a world of {n} "
                        f"(0..{n - 1}) exactly once, but has {'; '.join(problems)}")


def _sizes(name: str, value: Sizes) -> tuple[int, ...]:
    sizes = (value,) if isinstance(value, int) else tuple(value)
    if not sizes:
        raise TopologyError(f"mesh axis {name} has no size; e.g. {name}=2")
    return sizes


def _check_axes(axes: tuple[Axis, ...]) -> None:
    if not axes:
        raise TopologyError("a mesh needs at least one axis; e.g. dp=2")
    names = [a.name for a in axes]
    for a in axes:
        if a.name not in AXES:
            raise TopologyError(f"mesh axis {a.name!r} is not one of: {', '.join(AXES)}")
        if names.count(a.name) > 1:
            raise TopologyError(f"mesh axis {a.name!r} is named twice; give each axis once, "
                                f"e.g. pp=2,dp=2")
        for n in a.sizes:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise TopologyError(f"mesh axis {a.name} has size {n!r}; every axis needs "
                                    f"size >= 1 (a size-1 axis is the same as leaving it out)")
    if names != [n for n in AXES if n in names]:
        raise TopologyError(f"mesh axes {', '.join(names)} are out of order; they nest as "
                            f"{', '.join(n for n in AXES if n in names)} (outermost first)")
    if axes[0].ragged:
        raise TopologyError(f"mesh axis {axes[0].text()}: the outermost axis has one size; "
                            f"an inner axis may give one size per index of it (pp=2,dp=3/1)")
    for a in axes[1:]:
        if a.ragged and len(a.sizes) != axes[0].extent:
            raise TopologyError(f"mesh axis {a.text()} gives {len(a.sizes)} sizes but "
                                f"{axes[0].text()} has {axes[0].extent} indices; give one size "
                                f"per index of {axes[0].name}, or one for all")
