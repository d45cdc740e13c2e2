"""The topology's part of the plan file (DESIGN.md "Plan file"): `world_size` and `stages`.

    {"world_size": 4, "stages": [{"blocks": [0, 5], "replicas": 3, "ranks": [0, 1, 2]},
                                 {"blocks": [5, 9], "replicas": 1, "ranks": [3]}]}

`replicas` is required; `ranks` (the stage's global ranks, replica order) is optional and
defaults to consecutive ranks stage by stage; `blocks` belongs to the partition and is
passed through untouched. A hand-written plan is as valid as a generated one; a pure
data-parallel run is one stage with `replicas = world_size`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from approxdist.topology.layout import Topology, TopologyError


def to_plan(topology: Topology) -> dict[str, Any]:
    """The `world_size` and `stages` keys of a plan file for `topology`."""
    return {"world_size": topology.world_size,
            "stages": [{"replicas": len(ranks), "ranks": list(ranks)} for ranks in topology.stages]}


def from_plan(plan: Mapping[str, Any]) -> Topology:
    """The topology a plan file describes; `TopologyError` naming the bad key and value."""
    stages = plan.get("stages")
    if not isinstance(stages, list) or not stages:
        raise TopologyError(f"plan 'stages' = {stages!r} must be a non-empty list of "
                            f"{{\"replicas\": N}} objects, one per stage")
    counts, ranks = [], []
    for s, entry in enumerate(stages):
        if not isinstance(entry, Mapping):
            raise TopologyError(f"plan stages[{s}] = {entry!r} must be an object with "
                                f"'replicas' (and optionally 'ranks', 'blocks')")
        n = entry.get("replicas")
        if isinstance(n, bool) or not isinstance(n, int):
            raise TopologyError(f"plan stages[{s}].replicas = {n!r} must be an integer >= 1")
        counts.append(n)
        given = entry.get("ranks")
        if given is not None and not _rank_list(given, n):
            raise TopologyError(f"plan stages[{s}].ranks = {given!r} must list {n} integer "
                                f"rank(s), one per replica")
        ranks.append(given)
    if any(r is None for r in ranks) and not all(r is None for r in ranks):
        raise TopologyError("plan stages give 'ranks' for some stages only; give them for every "
                            "stage or for none")
    placement = None if ranks[0] is None else [r for rs in ranks for r in rs or ()]
    topology = Topology.grid(len(counts), counts, placement)
    world = plan.get("world_size")
    if world is not None and world != topology.world_size:
        raise TopologyError(f"plan world_size = {world!r} but its stages hold "
                            f"{topology.world_size} rank(s); make them agree")
    return topology


def _rank_list(value: Any, n: int) -> bool:
    return isinstance(value, list) and len(value) == n and \
        all(isinstance(r, int) and not isinstance(r, bool) for r in value)
