"""A mesh as text: the `pp=2,dp=3/1` spec, the CLI's rank lists, and the grid `plan show` prints."""

from __future__ import annotations

from approxdist.text import comma_list
from approxdist.topology.mesh import Mesh, TopologyError
from approxdist.topology.place import AXES, ROLES, WORDS

SPEC_FORM = "NAME=SIZE[,NAME=SIZE...], e.g. pp=2,dp=2 or tp=2,dp=2 (ragged: pp=2,dp=3/1)"


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    """`"2,1,1"` -> (2, 1, 1); `TopologyError` naming `what` on anything else."""
    return comma_list(text, int, TopologyError(f"{what} {text!r} is not a comma-separated "
                                               f"list of integers; e.g. 2,1,1"))


def parse_replicas(text: str) -> int | tuple[int, ...]:
    """`--replicas`: one count for every stage ("2") or one per stage ("2,1,1")."""
    values = parse_ints(text, "--replicas")
    return values[0] if len(values) == 1 else values


def parse_mesh(text: str, placement: tuple[int, ...] | None = None) -> Mesh:
    """`--mesh pp=2,dp=2`: axis sizes by name (any order; ragged sizes joined by `/`)."""
    sizes: dict[str, int | tuple[int, ...]] = {}
    for part in str(text).split(","):
        name, eq, value = part.strip().partition("=")
        if not eq or not name:
            raise TopologyError(f"mesh {text!r}: {part.strip()!r} is not NAME=SIZE; {SPEC_FORM}")
        if name not in AXES:
            raise TopologyError(f"mesh {text!r}: axis {name!r} is not one of: {', '.join(AXES)}")
        if name in sizes:
            raise TopologyError(f"mesh {text!r} names axis {name!r} twice; give each axis once")
        try:
            counts = tuple(int(v) for v in value.split("/"))
        except ValueError:
            raise TopologyError(f"mesh {text!r}: {name}={value!r} is not a size (an integer "
                                f">= 1, or sizes joined by / for a ragged axis)") from None
        if min(counts) < 1:
            raise TopologyError(f"mesh {text!r}: axis {name} has size {value}; every axis "
                                f"needs size >= 1 (leave an axis out for size 1)")
        sizes[name] = counts[0] if len(counts) == 1 else counts
    return Mesh.of(sizes, placement)


def check_world(mesh: Mesh, world_size: int,
                fix: str = "--mesh, --stages, --replicas, --servers, --workers") -> None:
    """The mesh must cover exactly the job's ranks."""
    if mesh.world_size != world_size:
        product = " x ".join(f"{a.name} {'/'.join(map(str, a.sizes))}" for a in mesh.axes)
        raise TopologyError(
            f"the mesh {mesh.spec} ({product}) places {mesh.world_size} rank(s) but the job "
            f"has {world_size}; start {mesh.world_size} workers (--world-size "
            f"{mesh.world_size}) or change the mesh ({fix})")


def render(mesh: Mesh) -> str:
    """The grid (the outermost axis across, the others down) and each rank's groups."""
    lines = [f"mesh {mesh.spec}: {mesh.world_size} rank(s) ({mesh.kind})"]
    outer, inner = mesh.axes[0], mesh.axes[1:]
    heads = [_label(outer.name, i, mesh) for i in range(outer.extent)]
    rows: dict[str, list[str]] = {}
    for slot, point in enumerate(mesh.points):
        key = ", ".join(_label(a.name, i, mesh) for a, i in zip(inner, point[1:])) or "ranks"
        rows.setdefault(key, ["-"] * outer.extent)[point[0]] = f"rank {mesh.ranks[slot]}"
    first = max([len(k) for k in rows] + [5]) + 2
    width = max(9, max(len(c) for c in heads + [c for r in rows.values() for c in r]) + 2)
    lines.append(" " * first + "".join(f"{h:<{width}}" for h in heads))
    lines += [f"{key:<{first}}" + "".join(f"{c:<{width}}" for c in cells)
              for key, cells in rows.items()]
    lines.append("")
    lines += _rank_table(mesh)
    return "\n".join(line.rstrip() for line in lines)


def _rank_table(mesh: Mesh) -> list[str]:
    """One line per rank: its index on each axis, and the ranks along each axis."""
    axes = [a.name for a in mesh.axes]
    spans = [a.name for a in mesh.axes if a.name != "role" and a.extent > 1]
    piped = "pp" in spans
    cols = ["rank", *(("role", "index") if "role" in axes else
                      (WORDS[n] for n in axes))]
    cols += ["same role" if "role" in axes else f"along {n}" for n in spans if n != "pp"]
    if piped:
        cols += ["upstream", "downstream", "pipeline row"]
    table = [cols]
    for rank in range(mesh.world_size):
        place = mesh.place(rank)
        cells = [str(rank)]
        cells += [place.role or "", str(place.replica)] if "role" in axes else \
            [str(place[n]) for n in axes]
        cells += [_ranks(mesh.along(rank, n)) for n in spans if n != "pp"]
        if piped:
            cells += _pipeline_cells(mesh, rank)
        table.append(cells)
    widths = [max(len(row[i]) for row in table) + 2 for i in range(len(cols))]
    return ["".join(f"{c:<{w}}" for c, w in zip(row, widths)) for row in table]


def _pipeline_cells(mesh: Mesh, rank: int) -> list[str]:
    """Every replica of the neighbouring stages (with the same shard), and the row."""
    place, stages = mesh.place(rank), mesh.num_stages
    up = _neighbours(mesh, rank, place.stage - 1) if place.stage > 0 else ()
    down = _neighbours(mesh, rank, place.stage + 1) if place.stage + 1 < stages else ()
    row = _ranks(mesh.along(rank, "pp")) if mesh.equal else "none (replicas differ)"
    return [_ranks(up), _ranks(down), row]


def _neighbours(mesh: Mesh, rank: int, stage: int) -> tuple[int, ...]:
    shard = mesh.place(rank).shard
    return tuple(r for r in mesh.along(rank, "pp", "dp")
                 if mesh.place(r).stage == stage and mesh.place(r).shard == shard)


def _label(axis: str, index: int, mesh: Mesh) -> str:
    if axis == "role":
        return f"{ROLES[index]}s"
    return f"index {index}" if "role" in mesh.names else f"{WORDS[axis]} {index}"


def _ranks(ranks: tuple[int, ...]) -> str:
    return ",".join(map(str, ranks)) if ranks else "-"
