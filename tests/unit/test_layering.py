"""The architecture's rules that code review would otherwise have to catch (docs/architecture.md)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import approxdist

SRC = Path(approxdist.__file__).parent

#: the layers, bottom up: a module may import its own layer and the ones below, never one
#: above. Names are the top-level packages (and modules) of src/approxdist; the package root
#: (`__init__`, `__main__`) is the top. docs/architecture.md ("The layers, bottom up")
#: shows the same order, one line each: change both together.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "registry", "text", "bench", "version", "cache"),
    ("kernels", "config"),
    ("data",),
    ("models",),
    ("optim",),
    ("launch",),
    ("trace",),
    ("comm",),
    ("topology",),
    ("data_parallel",),
    ("tensor_parallel",),
    ("pipeline",),
    ("hybrid",),
    ("param_server",),
    ("adaptive",),
    ("api",),
    ("planner",),
    ("train",),
    ("benchmarks",),
    ("analysis",),
    ("cluster",),
    ("experiments",),
    ("cli",),
    ("__init__", "__main__"),
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


def _package_of(path: Path) -> str:
    """The top-level package (or module) of src/approxdist that `path` belongs to."""
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def _imports(path: Path) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import of `path`, module level and inside functions alike, as (node, the
    absolute module it names); `from approxdist import x` names `approxdist.x`."""
    here = ["approxdist", *path.relative_to(SRC).with_suffix("").parts[:-1]]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            if module == "approxdist":
                for alias in node.names:
                    yield node, f"approxdist.{alias.name}"
            else:
                yield node, module


def _approxdist_modules(path: Path) -> set[str]:
    return {m for _, m in _imports(path) if m == "approxdist" or m.startswith("approxdist.")}


def _layer_of_module(module: str) -> str:
    """`approxdist.pipeline.schedule` -> `pipeline`; the root and its dunders -> `__init__`."""
    top = module.split(".")[1] if "." in module else "__init__"
    return top if top == "__main__" or not top.startswith("__") else "__init__"


def _describe(name: str) -> str:
    return f"{name!r} (layer {LEVEL[name]})"


def test_every_module_imports_only_its_own_layer_and_the_ones_below() -> None:
    """One scan of every import in src/approxdist against the one order in `LAYERS`."""
    problems = []
    for path in _sources():
        mine = _package_of(path)
        if mine not in LEVEL:
            problems.append(f"{_rel(path)}: package {mine!r} is in no layer; add it to LAYERS "
                            f"here and to docs/architecture.md")
            continue
        for module in sorted(_approxdist_modules(path)):
            theirs = _layer_of_module(module)
            if theirs not in LEVEL:
                problems.append(f"{_rel(path)} imports {module}: {theirs!r} is in no layer")
            elif LEVEL[theirs] > LEVEL[mine]:
                problems.append(f"{_rel(path)} imports {module}: {_describe(mine)} may not "
                                f"import {_describe(theirs)}, a higher layer; move the piece "
                                f"down to where its users are")
    assert not problems, "\n".join(problems)


def test_no_module_imports_a_private_name_of_another() -> None:
    """`from approxdist.x import _y` means `_y` is shared: give it a public name."""
    problems = []
    for path in _sources():
        for node, module in _imports(path):
            if not isinstance(node, ast.ImportFrom) or not module.startswith("approxdist"):
                continue
            private = [a.name for a in node.names
                       if a.name.startswith("_") and not a.name.startswith("__")]
            if private:
                problems.append(f"{_rel(path)}:{node.lineno} imports {', '.join(private)} "
                                f"from {module}")
    assert not problems, "\n".join(problems)


def _calls(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.func.attr for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}


def _packages_used(path: Path) -> set[str]:
    return {_layer_of_module(m) for m in _approxdist_modules(path)}


def test_config_imports_none_of_the_layers_it_configures() -> None:
    for path in (SRC / "config").glob("*.py"):
        outside = _packages_used(path) - {"config", "errors", "text"}
        assert not outside, (path.name, outside)


def test_below_the_launcher_nothing_asks_for_the_world_or_makes_groups() -> None:
    """Ranks come from a `Group`; process groups are made by `launch.group` and
    `topology.make_groups` only."""
    for path in _sources():
        rel = _rel(path)
        calls = _calls(path)
        if not rel.startswith("launch/"):
            assert not calls & {"get_rank", "get_world_size"}, rel
        if rel not in ("launch/group.py", "topology/groups.py"):
            assert "new_group" not in calls, rel


def test_the_bench_helpers_and_topology_sit_below_everything_they_serve() -> None:
    for folder, allowed in (("bench", {"bench", "errors", "text"}),
                            ("topology", {"topology", "errors", "text", "launch"})):
        for path in (SRC / folder).glob("*.py"):
            used = _packages_used(path)
            assert used <= allowed, (path.name, used - allowed)
    for path in (SRC / "topology").glob("*.py"):  # the topology object is pure: only
        if path.name != "groups.py":                # `make_groups` touches process groups
            assert not any("distributed" in m for _, m in _imports(path)), path.name


def test_the_cluster_runs_commands_and_never_imports_the_training_stack() -> None:
    """`cluster` starts approxdist commands as processes; it needs only link specs and the
    launcher's environment names."""
    for path in (SRC / "cluster").glob("*.py"):
        used = _packages_used(path)
        assert used <= {"cluster", "comm", "errors", "launch"}, (path.name, used)


#: what the cost model prices, read from the layers below where it is defined once: codec
#: sizes, link specs, the all-reduce algorithms' names, segments and steps, DataParallel's
#: bucket plan (all pure: no process group, no communication)
PLANNER_READS_BELOW = {
    "approxdist.comm.codecs", "approxdist.comm.netem", "approxdist.comm.collectives.base",
    "approxdist.comm.collectives.auto", "approxdist.comm.collectives.model",
    "approxdist.comm.collectives.registry", "approxdist.comm.collectives.wire",
    "approxdist.data_parallel.buckets",
}


def test_the_planner_is_pure_and_sits_below_training() -> None:
    """planner/ (cost/ included) may use topology, pipeline and config, and the pure
    descriptions in `PLANNER_READS_BELOW`; never train, cli or experiments, and no process
    group (docs/architecture.md: the planner is pure)."""
    allowed = {"planner", "errors", "registry", "text", "topology", "pipeline", "config"}
    #: the profiler measures a real model on real inputs: it builds them (still no group),
    #: and holds freed memory as the training ranks do (`launch.malloc`, a process setting);
    #: the tp layout reads a real model under its plan (the family's plan, `check_plan`)
    measuring = {"profiler.py": {"data", "models", "launch"},
                 "tp_layout.py": {"models", "tensor_parallel"}}
    for path in (SRC / "planner").rglob("*.py"):
        modules = {m for _, m in _imports(path)}
        used = {_layer_of_module(m) for m in modules
                if m.startswith("approxdist.") and m not in PLANNER_READS_BELOW}
        launch = {m for m in modules if m.startswith("approxdist.launch")}
        assert launch <= {"approxdist.launch.malloc"}, (path.name, launch)  # never a group
        extra = measuring.get(path.name, set()) if path.parent.name == "planner" else set()
        assert used <= allowed | extra, (path.name, used - allowed - extra)
        assert not any("distributed" in m for m in modules), path.name
