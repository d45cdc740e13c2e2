"""No test decides by wall-clock time (docs/testing.md, "Time in tests").

Every file under tests/ is parsed, and every comparison that involves a clock reading
(`time.monotonic()`, `time.perf_counter()`, `time.time()`, ..., `datetime.now()`, or a
name assigned from one, such as `elapsed = time.monotonic() - start`) fails this test,
wherever it stands: in an `assert`, or in an `if` / `while` that decides what the test
concludes. A bound in time that is the behaviour under test is asserted by counting or
through an injected clock instead; speed is measured by benchmarks.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

#: the clock functions of the `time` module (each also as `<name>_ns`)
CLOCKS = frozenset(f"{name}{ns}" for name in ("monotonic", "perf_counter", "time",
                                              "process_time", "thread_time")
                   for ns in ("", "_ns"))
#: `datetime.now()` and its kin
DATE_CLOCKS = frozenset({"now", "utcnow", "today"})

#: the only files allowed to compare a clock reading, each with why: a timeout that turns
#: a hang into a failure (as `run_on_ranks(timeout_s=...)` does), generous against any
#: machine's speed and never the property a test checks
ALLOWED: dict[str, str] = {
    # wait_until / wait_for_file: how long to wait for another process's file or exit
    "helpers/waiting.py": "a wait's timeout",
    # the simulated world's receive raises "deadlock?" instead of blocking forever
    "helpers/sim_world.py": "a simulated receive's deadlock timeout",
}


def _clock_aliases(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names the `time` module is imported as, clock functions imported by name)."""
    modules, functions = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "time"}
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            functions |= {a.asname or a.name for a in node.names if a.name in CLOCKS}
    return modules, functions


def _reads_clock(node: ast.AST, modules: set[str], functions: set[str],
                 tainted: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (
                    (f.value.id in modules and f.attr in CLOCKS)
                    or (f.value.id in ("datetime", "date") and f.attr in DATE_CLOCKS)):
                return True
            if isinstance(f, ast.Attribute) and f.attr in DATE_CLOCKS and \
                    isinstance(f.value, ast.Attribute) and f.value.attr in ("datetime", "date"):
                return True
            if isinstance(f, ast.Name) and f.id in functions:
                return True
        if tainted and isinstance(sub, ast.Name | ast.Attribute) and \
                ast.unparse(sub) in tainted:
            return True
    return False


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign) and node.value is not None:
        return [node.target]
    return []


#: an import of `time` or `datetime`
_IMPORTS_A_CLOCK = re.compile(r"^\s*(?:import|from)\s+(?:[\w., ]*[ ,])?(?:time|datetime)\b", re.M)


def clock_comparisons(source: str) -> list[int]:
    """The line of every comparison in `source` that involves a clock reading."""
    if not _IMPORTS_A_CLOCK.search(source):  # a file that imports neither reads no clock
        return []
    tree = ast.parse(source)
    modules, functions = _clock_aliases(tree)
    found: set[int] = set()
    scopes = [tree, *(n for n in ast.walk(tree)
                      if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))]
    for scope in scopes:
        tainted: set[str] = set()
        for _ in range(3):  # a name assigned from a name assigned from a clock, ...
            for node in ast.walk(scope):
                value = getattr(node, "value", None)
                if value is not None and _targets(node) and \
                        _reads_clock(value, modules, functions, tainted):
                    for target in _targets(node):
                        tainted |= {ast.unparse(t) for t in ast.walk(target)
                                    if isinstance(t, ast.Name | ast.Attribute)}
        found |= {node.lineno for node in ast.walk(scope) if isinstance(node, ast.Compare)
                  and _reads_clock(node, modules, functions, tainted)}
    return sorted(found)


def test_the_scan_finds_clock_comparisons_and_nothing_else() -> None:
    """The detector itself: each way of comparing a clock with a bound is found, and
    comparisons of figures that only mention time are not."""
    timed = """
import time
from time import perf_counter as now
import datetime

def elapsed_bound():
    start = time.monotonic()
    work()
    assert time.monotonic() - start < 30

def through_names():
    t0 = now()
    work()
    took = now() - t0
    per_step = took / 3
    assert per_step <= 0.35

class Timer:
    def check(self):
        self.begin = time.perf_counter_ns()
        if time.perf_counter_ns() - self.begin > 10**9:
            raise AssertionError("slow")

def by_date():
    assert (datetime.datetime.now() - START).total_seconds() < 5
"""
    assert clock_comparisons(timed) == [9, 16, 21, 25]
    untimed = """
import time

def figures(run):
    assert run["timeout_s"] == 30 and run["elapsed_s"] >= 0
    time.sleep(0.01)
    stamp = time.time()
    record(stamp)
    assert sorted(run["step_s"]) == run["step_s"]
"""
    assert clock_comparisons(untimed) == []


def test_no_test_compares_a_clock_reading() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(TESTS).as_posix()
        if rel not in ALLOWED:
            offenders += [f"tests/{rel}:{line}" for line in clock_comparisons(path.read_text())]
    assert not offenders, (
        "these lines compare a clock reading: decide by counting, an injected clock or the "
        "error a timeout produces instead (docs/testing.md, 'Time in tests'): "
        + ", ".join(offenders))


def test_every_allowed_file_still_needs_it() -> None:
    for rel in ALLOWED:
        assert clock_comparisons((TESTS / rel).read_text()), \
            f"tests/{rel} compares no clock reading any more; drop it from ALLOWED"
