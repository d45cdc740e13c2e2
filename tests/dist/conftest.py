"""Start the suite's fork server with every module the distributed tests import.

A rank forked by `run_on_ranks` (or the trainer's launcher) unpickles its entry function,
which imports the test module and with it pytest and the approxdist modules it uses: about
0.5 s of CPU a rank, every spawn, when the fork server holds only torch. Imported once in
the fork server (`launch/forkserver.py` takes extra modules on first use), a rank forks
with them loaded. The list is read from the test files' import statements (not by
importing the test modules: some probe the machine at import), with the approxdist
modules those import in turn, so a new test's imports are preloaded too; a module that
cannot be imported is skipped by the fork server.
"""

from __future__ import annotations

import ast
from pathlib import Path

import approxdist
from approxdist.launch.forkserver import fork_context

TESTS = Path(__file__).parents[1]
SRC = Path(approxdist.__file__).parent


def _imports(path: Path) -> set[str]:
    """The absolute imports of the file at `path`, anywhere in it (a function's own too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _source(module: str) -> Path | None:
    """The file of `module` if it is one of approxdist's."""
    head, *rest = module.split(".")
    if head != "approxdist":
        return None
    base = SRC.joinpath(*rest)
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()),
                None)


def imported_modules(folders: list[Path]) -> list[str]:
    """`pytest`, and the `approxdist.*` and `tests.helpers.*` modules the files in `folders`
    import, with every approxdist module those import in turn (the lazy imports inside
    functions too, such as the experiment presets the registry loads)."""
    found = {m for folder in folders for path in sorted(folder.glob("*.py"))
             for m in _imports(path)}
    todo = sorted(found)
    while todo:
        path = _source(todo.pop())
        for module in _imports(path) - found if path else ():
            found.add(module)
            todo.append(module)
    return sorted(m for m in found
                  if m == "pytest" or m.split(".")[0] == "approxdist"
                  or m.startswith("tests.helpers."))


fork_context(*imported_modules([TESTS / "dist", TESTS / "helpers"]))
