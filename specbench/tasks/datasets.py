"""Dataset loading: native record formats -> ``Query`` objects.

Formats (the shapes of the public files, see shared/data/README.md):
- ``iwslt``: one JSON array of ``{"translation": {"de": ..., "en": ...}}`` (also JSONL);
- ``xsum``: JSONL ``{document, summary, id}``;
- ``gsm8k``: JSONL ``{question, answer}`` (answer ends in ``#### n``);
- ``mt_bench``: JSONL ``{question_id, category, turns[], reference?}`` (Spec-Bench's format too).
A path is a local file or ``embedded:<file>`` (the suite shipped in ``specbench/tasks/embedded``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from specbench.errors import SpecbenchError

EMBEDDED_DIR = Path(__file__).parent / "embedded"


@dataclass
class Query:
    id: str
    task: str
    fields: dict  # template fields: source / document / question / turn
    reference: str | None = None
    turns: list[str] = field(default_factory=list)  # chat: all user turns (the first is asked)
    category: str | None = None


def _need(row: Mapping, key: str, where: str):
    if not isinstance(row, Mapping) or key not in row:
        raise SpecbenchError(f"{where}: record has no field '{key}' (fields: {sorted(row) if isinstance(row, Mapping) else type(row).__name__})",
                             "fix the record, or pick the dataset format that matches this file")
    return row[key]


def _iwslt(row, i, where, src="de", tgt="en"):
    pair = _need(row, "translation", where)
    return Query(id=f"iwslt-{i}", task="translation", fields={"source": _need(pair, src, where)},
                 reference=_need(pair, tgt, where))


def _xsum(row, i, where):
    return Query(id=str(row.get("id", f"xsum-{i}")), task="summarization",
                 fields={"document": _need(row, "document", where)}, reference=_need(row, "summary", where))


def _gsm8k(row, i, where):
    return Query(id=f"gsm8k-{i}", task="math", fields={"question": _need(row, "question", where)},
                 reference=_need(row, "answer", where))


def _mt_bench(row, i, where):
    turns = _need(row, "turns", where)
    if not isinstance(turns, list) or not turns:
        raise SpecbenchError(f"{where}: field 'turns' must be a non-empty list", "fix the record")
    ref = row.get("reference")
    return Query(id=f"mt-{_need(row, 'question_id', where)}", task="chat", fields={"turn": turns[0]},
                 reference=ref[0] if isinstance(ref, list) and ref else None, turns=list(turns),
                 category=row.get("category"))


FORMATS: dict[str, Callable] = {"iwslt": _iwslt, "xsum": _xsum, "gsm8k": _gsm8k, "mt_bench": _mt_bench}


def resolve_path(path: str) -> Path:
    if path.startswith("embedded:"):
        p = EMBEDDED_DIR / path.split(":", 1)[1]
        if not p.exists():
            known = sorted(f.name for f in EMBEDDED_DIR.iterdir() if f.suffix in (".json", ".jsonl"))
            raise SpecbenchError(f"no embedded dataset file '{p.name}'", f"use one of: {', '.join(known)}")
        return p
    p = Path(path).expanduser()
    if not p.is_file():
        raise SpecbenchError(f"dataset file '{path}' does not exist", "check dataset.path (a .json or .jsonl file)")
    return p


def read_records(path: Path) -> Iterable[tuple[dict, str]]:
    """Yield (record, 'file:line') from a JSON array or JSONL file."""
    text = path.read_text(encoding="utf-8")
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


def load_source(fmt: str, path: str, task: str | None = None, limit: int | None = None, seed: int = 0,
                shuffle: bool = False, **format_args) -> list[Query]:
    if fmt not in FORMATS:
        raise SpecbenchError(f"unknown dataset format '{fmt}'", f"use one of: {', '.join(FORMATS)}")
    parse = FORMATS[fmt]
    queries = [parse(row, i, where, **format_args) for i, (row, where) in enumerate(read_records(resolve_path(path)))]
    if task:
        for q in queries:
            q.task = task
    if shuffle:
        random.Random(seed).shuffle(queries)
    return queries[:limit] if limit is not None else queries


def load_queries(sources: list[Mapping], limit: int | None = None, seed: int = 0, shuffle: bool = False) -> list[Query]:
    """Load every source; ``limit`` caps each source. Raises if nothing is left."""
    if not sources:
        raise SpecbenchError("the dataset config lists no sources", "add dataset.sources or pick dataset=embedded")
    if limit is not None and limit < 1:
        raise SpecbenchError(f"dataset.limit must be at least 1, got {limit}", "use dataset.limit=null for all")
    queries: list[Query] = []
    for src in sources:
        src = dict(src)
        queries += load_source(src.pop("format"), src.pop("path"), limit=limit, seed=seed, shuffle=shuffle, **src)
    if not queries:
        raise SpecbenchError("the dataset is empty: its files hold no records",
                             "check dataset.path / dataset.sources point at non-empty files")
    return queries
