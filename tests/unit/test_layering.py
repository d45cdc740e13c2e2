"""The architecture's rules that code review would otherwise have to catch (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import approxdist

SRC = Path(approxdist.__file__).parent


def _calls_and_imports(path: Path) -> tuple[set[str], set[str]]:
    tree = ast.parse(path.read_text())
    calls = {node.func.attr for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    modules = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    return calls, modules


def test_config_imports_none_of_the_layers_it_configures() -> None:
    for path in (SRC / "config").glob("*.py"):
        _, modules = _calls_and_imports(path)
        outside = {m for m in modules if m.startswith("approxdist")
                   and m.split(".")[1] not in ("config", "errors", "text")}
        assert not outside, (path.name, outside)


def test_below_the_launcher_nothing_asks_for_the_world_or_makes_groups() -> None:
    """Ranks come from a `Group`; process groups are made by `launch.group` and
    `topology.make_groups` only."""
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        calls, _ = _calls_and_imports(path)
        if not rel.startswith("launch/"):
            assert not calls & {"get_rank", "get_world_size"}, rel
        if rel not in ("launch/group.py",):
            assert "new_group" not in calls or rel == "topology/groups.py", rel


def test_the_bench_helpers_and_topology_sit_below_everything_they_serve() -> None:
    for folder, allowed in (("bench", {"bench", "errors", "text"}),
                            ("topology", {"topology", "errors", "text", "launch"})):
        for path in (SRC / folder).glob("*.py"):
            _, modules = _calls_and_imports(path)
            used = {m.split(".")[1] for m in modules if m.startswith("approxdist.")}
            assert used <= allowed, (path.name, used - allowed)
    _, layout = _calls_and_imports(SRC / "topology" / "layout.py")
    assert not any("distributed" in m for m in layout)  # the topology object is pure


def test_the_cluster_runs_commands_and_never_imports_the_training_stack() -> None:
    """`cluster` starts approxdist commands as processes; it needs only link specs."""
    for path in (SRC / "cluster").glob("*.py"):
        _, modules = _calls_and_imports(path)
        used = {m.split(".")[1] for m in modules if m.startswith("approxdist.")}
        assert used <= {"cluster", "comm", "errors"}, (path.name, used)


#: what the cost model prices, read from the layers below where it is defined once: codec
#: sizes, link specs, the all-reduce algorithms' names, segments and steps, DataParallel's
#: bucket plan (all pure: no process group, no communication)
PLANNER_READS_BELOW = {
    "approxdist.comm.codecs", "approxdist.comm.netem", "approxdist.comm.collectives.base",
    "approxdist.comm.collectives.hybrid", "approxdist.comm.collectives.model",
    "approxdist.comm.collectives.registry", "approxdist.comm.collectives.wire",
    "approxdist.data_parallel.buckets",
}


def test_the_planner_is_pure_and_sits_below_training() -> None:
    """planner/ (cost/ included) may use topology, pipeline and config, and the pure
    descriptions in `PLANNER_READS_BELOW`; never train, cli or experiments, and no process
    group (DESIGN.md: the solver is pure)."""
    allowed = {"planner", "errors", "registry", "text", "topology", "pipeline", "config"}
    #: the profiler measures a real model on real inputs: it builds them (still no group),
    #: and holds freed memory as the training ranks do (`launch.malloc`, a process setting)
    measuring = {"profiler.py": {"data", "models", "launch"}}
    for path in (SRC / "planner").rglob("*.py"):
        tree = ast.parse(path.read_text())
        modules = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        modules |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        used = {m.split(".")[1] for m in modules
                if m.startswith("approxdist.") and m not in PLANNER_READS_BELOW}
        launch = {m for m in modules if m.startswith("approxdist.launch")}
        assert launch <= {"approxdist.launch.malloc"}, (path.name, launch)  # never a group
        extra = measuring.get(path.name, set()) if path.parent.name == "planner" else set()
        assert used <= allowed | extra, (path.name, used - allowed - extra)
        assert not any("distributed" in m for m in modules), path.name
