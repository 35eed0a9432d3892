"""The house's rules for the package's functions, so that a regression is caught when it is made rather than by the
next review: every function at most 60 lines, at most 8 parameters (``self`` and ``cls`` not counted; a longer list
is a bundle waiting to be named, as ``cost_cache.Probe`` or ``eagle3_files.Fit``), no import circle between the
package's modules, whether an import runs at import time, inside a function or for type checking only, and no import
running up a floor (``FLOORS``: a module imports only from its own floor and those below it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "specbench"
MAX_LINES, MAX_PARAMETERS = 60, 8


def functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(PACKAGE.parent), node


def parameters(node: ast.FunctionDef) -> int:
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def test_every_function_is_at_most_60_lines():
    long = [
        f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path, node in functions()
        if node.end_lineno - node.lineno + 1 > MAX_LINES
    ]
    assert not long, "split these functions: " + "; ".join(long)


def test_every_function_takes_at_most_8_parameters():
    wide = [
        f"{path}:{node.lineno} {node.name} ({parameters(node)} parameters)"
        for path, node in functions()
        if parameters(node) > MAX_PARAMETERS
    ]
    assert not wide, "bundle what these take: " + "; ".join(wide)


def module_imports(path: Path) -> set[str]:
    """The ``specbench`` modules ``path`` imports anywhere: at module level, inside functions and in ``TYPE_CHECKING``
    blocks alike (a type-only import is a dependency a reader follows too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for sub in ast.walk(tree):
        if isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith("specbench"):
            found.add(sub.module)
            found |= {f"{sub.module}.{a.name}" for a in sub.names}  # ``from pkg import module``
        elif isinstance(sub, ast.Import):
            found |= {a.name for a in sub.names if a.name.startswith("specbench")}
    return found


def graph() -> dict[str, set[str]]:
    names = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
    }
    return {m: {i for i in module_imports(p) if i in names and i != m} for m, p in names.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), a package and its own modules apart: a
    package's ``__init__`` re-exporting its modules, which import from each other, is not a circle of the house."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def related(a: str, b: str) -> bool:
        return a.startswith(b + ".") or b.startswith(a + ".")

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if related(v, w):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_whatever_the_import():
    found = circles(graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


# The floors of the house, from the ground up: a module imports only from its own floor and those below it.
FLOORS = [
    {"errors"},
    {"arms", "timing", "files", "configs", "profiling", "validate"},
    {"records", "provenance"},
    {"models", "tasks", "policy"},
    {"selection"},
    {"decoding"},
    {"drafters"},
    {"training"},
    {"pipelines"},
    {"reproduction"},
    {"bridge"},
    {"cli"},
]


def floor(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None  # the package itself (its version)
    return next(i for i, rooms in enumerate(FLOORS) if parts[1] in rooms)


def test_no_import_runs_up_a_floor():
    up = sorted(
        f"{m} -> {n}"
        for m, imports in graph().items()
        for n in imports
        if floor(m) is not None and floor(n) is not None and floor(n) > floor(m)
    )
    assert not up, "imports running up a floor: " + "; ".join(up)


def test_the_circle_finder_finds_a_planted_circle():
    planted = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a": {"a.x"}, "b": set()}
    assert circles(planted) == [["a.x", "a.y", "a.z"]]
    assert circles({"a": {"a.x"}, "a.x": {"a"}}) == []  # a package and its own module


@pytest.mark.parametrize(
    "source, expected",
    [("def f(self, a, b, *c, d, **e): pass", 5), ("def f(a, b, c, d, e, f, g, h, i): pass", 9)],
)
def test_the_parameter_count_leaves_self_out(source, expected):
    node = ast.parse(source).body[0]
    assert parameters(node) == expected
