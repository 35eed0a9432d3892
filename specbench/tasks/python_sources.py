"""Training prompts for the ``code`` task from real Python: the documented public functions of a tree of Python
sources (the running interpreter's standard library, ``stdlib:``, or a directory of .py files), each split into
its signature and docstring (the prompt) and its body (the reference)."""

from __future__ import annotations

import ast
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from specbench.errors import SpecbenchError

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def _is_test_file(rel: Path) -> bool:
    return (
        any(part in SKIP_DIRS for part in rel.parts[:-1])
        or rel.name.startswith("test_")
        or rel.stem.endswith("_test")
        or rel.name in ("test.py", "tests.py", "conftest.py")
    )


def _strip_indent(text: str, indent: int) -> str:
    """``text`` (whose first line is already cut at its column) with ``indent`` leading spaces removed from
    every later line that has them."""
    lines = text.split("\n")
    return "\n".join(
        [lines[0]] + [ln[indent:] if not ln[:indent].strip() else ln.lstrip() for ln in lines[1:]]
    )


def _segment(lines: list[str], start: tuple[int, int], end: tuple[int, int] | None) -> str:
    """The source text from ``start`` to ``end`` ((line, column) pairs, lines from 1; end None: to the end)."""
    (l0, c0), (l1, c1) = start, end or (len(lines), len(lines[-1]))
    if l0 == l1:
        return lines[l0 - 1][c0:c1]
    return "\n".join([lines[l0 - 1][c0:], *lines[l0 : l1 - 1], lines[l1 - 1][:c1]])


def public_functions(tree: ast.Module) -> list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    """A module's top-level functions and the methods of its public top-level classes, with their qualified
    names, in source order."""
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    found = [(f, f.name) for f in tree.body if isinstance(f, kinds)]
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and not cls.name.startswith("_"):
            found += [(f, f"{cls.name}.{f.name}") for f in cls.body if isinstance(f, kinds)]
    return sorted(found, key=lambda pair: pair[0].lineno)


def python_function_records(
    path: str, max_chars: int = 4000, exclude_names: Iterable[str] = ()
) -> Iterable[tuple[dict, str]]:
    """Rows ``{id, prompt, body}`` of the documented public functions of a tree of Python sources.

    ``path``: ``stdlib:`` (the running interpreter's standard library, ``sysconfig.get_paths()["stdlib"]``)
    or a directory of .py files. The .py files are read in sorted order, leaving out test directories, test
    files (``test_*.py``, ``*_test.py``), site-packages and private modules and packages (``_pydecimal.py``).
    Of each file: the top-level functions and the methods of top-level classes that have a non-empty
    docstring and a body after it, whose name (and class name) does not start with ``_``, whose source is
    at most ``max_chars`` characters and whose name is not in ``exclude_names`` (HumanEval's entry points:
    a disjoint training set); of a name defined twice (a property's setter), the first. ``prompt`` is the
    source from ``def`` to the end of the docstring (``def name(args):\n    \"\"\"docstring\"\"\"\n``,
    dedented), ``body`` the rest; ``id`` is the file's path under the root and the qualified name
    (``json/__init__.py:dumps``). Files that do not parse or are not UTF-8 are skipped."""
    root = Path(sysconfig.get_paths()["stdlib"]) if path == "stdlib:" else Path(path).expanduser()
    if not root.is_dir():
        raise SpecbenchError(
            f"python_functions: '{path}' is not a directory of Python sources",
            "use path: stdlib: (the interpreter's standard library) or a directory of .py files",
        )
    exclude = set(exclude_names)
    files = sorted((p.relative_to(root) for p in root.rglob("*.py")), key=lambda r: r.as_posix())
    for rel in files:
        if _is_test_file(rel) or any(part.startswith("_") and part != "__init__.py" for part in rel.parts):
            continue
        try:
            text = (root / rel).read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        lines = text.split("\n")
        found = public_functions(tree)
        seen: set[str] = set()
        for node, qualname in found:
            if (
                node.name.startswith("_")
                or node.name in exclude
                or not (ast.get_docstring(node) or "").strip()
                or len(node.body) < 2
                or qualname in seen
            ):
                continue  # private, undocumented, or a redefinition (a property's setter): the first one counts
            seen.add(qualname)
            start = (node.lineno, node.col_offset)
            if len(_segment(lines, start, (node.end_lineno, node.end_col_offset))) > max_chars:
                continue  # (ast.get_source_segment's text, without splitting the file once per function)
            doc = node.body[0]
            doc_end = (doc.end_lineno, doc.end_col_offset)
            prompt = _strip_indent(_segment(lines, start, doc_end), node.col_offset) + "\n"
            rest = _segment(lines, doc_end, (node.end_lineno, node.end_col_offset))
            body = _strip_indent(rest, node.col_offset).lstrip(" ;").lstrip("\n") + "\n"
            yield (
                {"id": f"{rel.as_posix()}:{qualname}", "prompt": prompt, "body": body},
                f"{root / rel}:{node.lineno}",
            )
