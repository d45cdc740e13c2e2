"""Start the suite's fork server with every module the distributed tests import.

A rank forked by `run_on_ranks` (or the trainer's launcher) unpickles its entry function,
which imports the test module and with it pytest and the approxdist modules it uses: about
0.5 s of CPU a rank, every spawn, when the fork server holds only torch. Imported once in
the fork server (`launch/forkserver.py` takes extra modules on first use), a rank forks
with them loaded. The list is read from the test files' import statements (not by
importing the test modules: some probe the machine at import), so a new test's imports
are preloaded too; a module that cannot be imported is skipped by the fork server.
"""

from __future__ import annotations

import ast
from pathlib import Path

from approxdist.launch.forkserver import fork_context

TESTS = Path(__file__).parents[1]


def imported_modules(folders: list[Path]) -> list[str]:
    """The `pytest`, `approxdist.*` and `tests.helpers.*` modules the files in `folders`
    import, anywhere in the file (a function's own imports too)."""
    found: set[str] = set()
    for path in sorted(p for folder in folders for p in folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
    return sorted(m for m in found
                  if m == "pytest" or m.split(".")[0] == "approxdist"
                  or m.startswith("tests.helpers."))


fork_context(*imported_modules([TESTS / "dist", TESTS / "helpers"]))
