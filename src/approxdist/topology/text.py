"""A topology as text: the grid `approxdist plan show` prints, and the CLI's rank lists."""

from __future__ import annotations

from approxdist.text import comma_list
from approxdist.topology.layout import Topology, TopologyError


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    """`"2,1,1"` -> (2, 1, 1); `TopologyError` naming `what` on anything else."""
    return comma_list(text, int, TopologyError(f"{what} {text!r} is not a comma-separated "
                                               f"list of integers; e.g. 2,1,1"))


def parse_replicas(text: str) -> int | tuple[int, ...]:
    """`--replicas`: one count for every stage ("2") or one per stage ("2,1,1")."""
    values = parse_ints(text, "--replicas")
    return values[0] if len(values) == 1 else values


def render(topology: Topology) -> str:
    """The grid (replicas down, stages across) and each rank's groups, one line each."""
    t = topology
    lines = [f"topology: {t.world_size} rank(s), {t.num_stages} stage(s), replicas "
             f"{','.join(map(str, t.replicas))} ({t.kind})"]
    width = max(9, max(len(f"rank {r}") for r in range(t.world_size)) + 2)
    lines.append(" " * 11 + "".join(f"{f'stage {s}':<{width}}" for s in range(t.num_stages)))
    for j in range(max(t.replicas)):
        cells = [f"rank {ranks[j]}" if j < len(ranks) else "-" for ranks in t.stages]
        lines.append(f"{f'replica {j}':<11}" + "".join(f"{c:<{width}}" for c in cells))
    lines.append("")
    lines.append(f"{'rank':<6}{'stage':<7}{'replica':<9}{'replicas':<14}{'upstream':<14}"
                 f"{'downstream':<14}pipeline row")
    for rank in range(t.world_size):
        g = t.groups_of(rank)
        row = _ranks(g.pipeline) if g.pipeline is not None else "none (replicas differ)"
        lines.append(f"{rank:<6}{g.place.stage:<7}{g.place.replica:<9}{_ranks(g.replicas):<14}"
                     f"{_ranks(g.upstream):<14}{_ranks(g.downstream):<14}{row}")
    return "\n".join(line.rstrip() for line in lines)


def _ranks(ranks: tuple[int, ...] | None) -> str:
    return ",".join(map(str, ranks)) if ranks else "-"
