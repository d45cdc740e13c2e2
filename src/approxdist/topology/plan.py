"""The mesh's part of the plan file (docs/planner.md, "Planning"): `world_size` and `stages`.

    {"world_size": 4, "stages": [{"blocks": [0, 5], "replicas": 3, "ranks": [0, 1, 2]},
                                 {"blocks": [5, 9], "replicas": 1, "ranks": [3]}]}

`replicas` is required; `tp` (tensor-parallel shards of every replica, the same for every
stage) is optional and defaults to 1; `ranks` (the stage's global ranks, row-major:
replica by replica, shard by shard) is optional and defaults to consecutive ranks stage
by stage; `blocks` belongs to the partition and is passed through untouched. A
hand-written plan is as valid as a generated one; a pure data-parallel run is one stage
with `replicas = world_size`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from approxdist.topology.mesh import Mesh, TopologyError


def to_plan(mesh: Mesh) -> dict[str, Any]:
    """The `world_size` and `stages` keys of a plan file for `mesh` (a pp/dp/tp mesh)."""
    if "role" in mesh.names:
        raise TopologyError(f"a parameter server's mesh ({mesh.spec}) has no stages to plan")
    tp = mesh.extent("tp")
    stages = [{"replicas": n, **({"tp": tp} if tp > 1 else {}), "ranks": list(ranks)}
              for n, ranks in zip(mesh.replicas, mesh.stage_ranks)]
    return {"world_size": mesh.world_size, "stages": stages}


def from_plan(plan: Mapping[str, Any]) -> Mesh:
    """The mesh a plan file describes; `TopologyError` naming the bad key and value."""
    stages = plan.get("stages")
    if not isinstance(stages, list) or not stages:
        raise TopologyError(f"plan 'stages' = {stages!r} must be a non-empty list of "
                            f"{{\"replicas\": N}} objects, one per stage")
    counts, shards, ranks = [], [], []
    for s, entry in enumerate(stages):
        if not isinstance(entry, Mapping):
            raise TopologyError(f"plan stages[{s}] = {entry!r} must be an object with "
                                f"'replicas' (and optionally 'tp', 'ranks', 'blocks')")
        n, tp = entry.get("replicas"), entry.get("tp", 1)
        for key, value in (("replicas", n), ("tp", tp)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TopologyError(f"plan stages[{s}].{key} = {value!r} must be an integer >= 1")
        counts.append(n)
        shards.append(tp)
        given = entry.get("ranks")
        if given is not None and not _rank_list(given, n * tp):
            raise TopologyError(f"plan stages[{s}].ranks = {given!r} must list {n * tp} "
                                f"integer rank(s), one per replica and shard")
        ranks.append(given)
    if len(set(shards)) > 1:
        raise TopologyError(f"plan stages give tp = {shards}; every stage needs the same "
                            f"number of tensor-parallel shards")
    if any(r is None for r in ranks) and not all(r is None for r in ranks):
        raise TopologyError("plan stages give 'ranks' for some stages only; give them for every "
                            "stage or for none")
    placement = None if ranks[0] is None else [r for rs in ranks for r in rs or ()]
    sizes: dict[str, Any] = {"pp": len(counts), "dp": counts}
    if shards[0] > 1:
        sizes["tp"] = shards[0]
    mesh = Mesh.of(sizes, placement)
    world = plan.get("world_size")
    if world is not None and world != mesh.world_size:
        raise TopologyError(f"plan world_size = {world!r} but its stages hold "
                            f"{mesh.world_size} rank(s); make them agree")
    return mesh


def _rank_list(value: Any, n: int) -> bool:
    return isinstance(value, list) and len(value) == n and \
        all(isinstance(r, int) and not isinstance(r, bool) for r in value)
