"""Prompt formats: a task template fills the query's fields; the target's format wraps the text.

``style``: ``chat`` applies the tokenizer's chat template to one user message; ``plain`` tokenizes
the filled template as is (T5-style task prefixes are plain templates).
"""

from __future__ import annotations

from collections.abc import Mapping

from specbench.errors import SpecbenchError
from specbench.tasks.datasets import Query

STYLES = ("chat", "plain")


def render(query: Query, templates: Mapping[str, str]) -> str:
    if query.task not in templates:
        raise SpecbenchError(f"no prompt template for task '{query.task}'",
                             f"add it under the dataset's templates (known: {', '.join(templates)})")
    try:
        return templates[query.task].format(**query.fields)
    except KeyError as exc:
        raise SpecbenchError(f"template for task '{query.task}' uses field {exc} which the records do not have",
                             f"use one of: {', '.join(query.fields)}") from exc


def build_prompt(query: Query, tokenizer, style: str, templates: Mapping[str, str], system: str | None = None) -> list[int]:
    """Token ids of the prompt for ``query``."""
    text = render(query, templates)
    if style == "chat":
        if not getattr(tokenizer, "chat_template", None):
            raise SpecbenchError("prompt style 'chat' but the tokenizer has no chat template",
                                 "set target.prompt.style=plain for this model")
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    if style == "plain":
        return list(tokenizer(text)["input_ids"])
    raise SpecbenchError(f"unknown prompt style '{style}'", f"use one of: {', '.join(STYLES)}")
