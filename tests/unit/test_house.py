"""The house's rules for the package's functions, so that a regression is caught when it is made rather than by the
next review: every function at most 60 lines, at most 8 parameters (``self`` and ``cls`` not counted; a longer list
is a bundle waiting to be named, as ``cost_cache.Probe`` or ``eagle3_files.Fit``), and no import circle between
the package's modules at import time (a module may import upward only inside a function)."""

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
    """The ``specbench`` modules ``path`` imports at import time (module level, ``TYPE_CHECKING`` blocks left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else ():
            if isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith("specbench"):
                found.add(sub.module)
            elif isinstance(sub, ast.Import):
                found |= {a.name for a in sub.names if a.name.startswith("specbench")}
    return found


def test_no_import_circle_at_import_time():
    names = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in PACKAGE.rglob("*.py")
    }
    graph = {m: {i for i in module_imports(p) if i in names and i != m} for m, p in names.items()}
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        seen[m] = 1
        for n in sorted(graph[m]):
            if seen.get(n) == 1 and not m.startswith(
                n + "."
            ):  # a package's __init__ importing its own modules
                return [*path, m, n]
            if n not in seen:
                found = visit(n, [*path, m])
                if found:
                    return found
        seen[m] = 2
        return None

    for m in sorted(graph):
        if m not in seen:
            circle = visit(m, [])
            assert circle is None, "an import circle: " + " -> ".join(circle)


@pytest.mark.parametrize(
    "source, expected",
    [("def f(self, a, b, *c, d, **e): pass", 5), ("def f(a, b, c, d, e, f, g, h, i): pass", 9)],
)
def test_the_parameter_count_leaves_self_out(source, expected):
    node = ast.parse(source).body[0]
    assert parameters(node) == expected
