"""Record formats -> ``Query`` objects: one parser per shape of the public files (see shared/data/README.md).

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

A query's ``task`` labels it in every table (a Spec-Bench category, or a source's ``task:``); its
``kind`` is the task its record format defines, which picks its prompt template and its quality
metric (turn-based records are ``chat`` whatever their category).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from specbench.errors import SpecbenchError

# Language codes -> the names prompts use ("translate German to English: ..."); other codes stay as written.
LANGUAGES = {
    "de": "German",
    "en": "English",
    "fr": "French",
    "ro": "Romanian",
    "ja": "Japanese",
    "ru": "Russian",
    "zh": "Chinese",
    "es": "Spanish",
    "it": "Italian",
    "cs": "Czech",
}


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
        blob = json.dumps(
            [self.kind, self.fields, self.turns], sort_keys=True, ensure_ascii=False, default=str
        )
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def need(row: Mapping, key: str, where: str):
    if isinstance(row, Mapping) and key in row and row[key] is None:  # the field is there, its value is not
        raise SpecbenchError(
            f"{where}: record's field '{key}' is null",
            f"give '{key}' a value in that record, or leave the record out of the data file",
        )
    if not isinstance(row, Mapping) or key not in row:
        have = sorted(row) if isinstance(row, Mapping) else type(row).__name__
        raise SpecbenchError(
            f"{where}: record has no field '{key}' (it has: {have})",
            "fix the record, or pick the dataset format that matches this file",
        )
    return row[key]


def _translation(row, i, where, source_lang="de", target_lang="en", id_prefix="translation"):
    pair = need(row, "translation", where)
    fields = {
        "source": need(pair, source_lang, f"{where} (translation)"),
        "source_language": LANGUAGES.get(source_lang, source_lang),
        "target_language": LANGUAGES.get(target_lang, target_lang),
    }
    return Query(
        id=f"{id_prefix}-{i}",
        task="translation",
        fields=fields,
        reference=need(pair, target_lang, f"{where} (translation)"),
    )


def _iwslt(row, i, where, source_lang="de", target_lang="en"):
    return _translation(row, i, where, source_lang, target_lang, id_prefix="iwslt")


def _xsum(row, i, where):
    return Query(
        id=str(row.get("id") or f"xsum-{i}"),
        task="summarization",
        fields={"document": need(row, "document", where)},
        reference=need(row, "summary", where),
    )


def _cnn_dm(row, i, where):
    """CNN/DailyMail (3.0.0): the article is the document to summarize, the highlights the reference."""
    return Query(
        id=str(row.get("id") or f"cnn_dm-{i}"),
        task="summarization",
        fields={"document": need(row, "article", where)},
        reference=need(row, "highlights", where),
    )


def _qa(row, i, where):
    answer = need(row, "answer", where)
    return Query(
        id=f"qa-{i}",
        task="qa",
        fields={"question": need(row, "question", where)},
        reference=answer[0] if isinstance(answer, list) and answer else (answer or None),
    )


def _gsm8k(row, i, where):
    return Query(
        id=f"gsm8k-{i}",
        task="math",
        fields={"question": need(row, "question", where)},
        reference=need(row, "answer", where),
    )


def _mt_bench(row, i, where, task_from_category=False):
    turns = list(need(row, "turns", where))
    if not turns or not all(isinstance(t, str) for t in turns):
        raise SpecbenchError(f"{where}: field 'turns' must be a non-empty list of strings", "fix the record")
    ref = row.get("reference")
    category = row.get("category")
    # A turn-based record is a chat query whatever its category (Spec-Bench's "translation" or "math"
    # records hold only `turns`): its category is its label in the tables, never its template.
    return Query(
        id=f"q{need(row, 'question_id', where)}",
        task=category if task_from_category and category else "chat",
        fields={"turn": turns[0]},
        reference=ref[0] if isinstance(ref, list) and ref else None,
        turns=turns,
        category=category,
        kind="chat",
    )


def _alpaca(row, i, where):
    """Alpaca-style chat records: ``{instruction, input?, output}`` (one user turn, the instruction and its
    non-empty ``input`` as in Code Alpaca, and a reference answer)."""
    instruction = need(row, "instruction", where)
    if row.get("input"):
        instruction = f"{instruction}\n\n{row['input']}"
    return Query(
        id=f"alpaca-{i}",
        task="chat",
        fields={"turn": instruction},
        reference=row.get("output"),
        turns=[instruction],
        category=row.get("dataset"),
    )


def _humaneval(row, i, where):
    """HumanEval: the prompt (signature + docstring) is the code to complete, the canonical solution the reference."""
    return Query(
        id=str(need(row, "task_id", where)),
        task="code",
        fields={"prompt": need(row, "prompt", where)},
        reference=need(row, "canonical_solution", where),
    )


def _python_function(row, i, where):
    """A function of a Python source tree (a row of ``python_function_records``): ``{id, prompt, body}``."""
    return Query(
        id=str(need(row, "id", where)),
        task="code",
        fields={"prompt": need(row, "prompt", where)},
        reference=row.get("body"),
    )


FORMATS: dict[str, Callable] = {
    "iwslt": _iwslt,
    "translation": _translation,
    "xsum": _xsum,
    "cnn_dm": _cnn_dm,
    "gsm8k": _gsm8k,
    "qa": _qa,
    "mt_bench": _mt_bench,
    "alpaca": _alpaca,
    "humaneval": _humaneval,
    "python_functions": _python_function,
}
