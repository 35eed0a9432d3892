"""Prompt formats: a task template fills the query's fields; the target's style wraps the text.

``style``: ``chat`` applies the tokenizer's chat template (system message, earlier turns with the
model's own answers, then the new user message); ``plain`` tokenizes the text as is (T5-style task
prefixes are plain templates). Templates live in the ``templates`` config; ``default`` serves any
task without its own (Spec-Bench categories, for example); ``shot`` formats n-shot examples.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from specbench.errors import SpecbenchError
from specbench.tasks.datasets import Query

log = logging.getLogger(__name__)
STYLES = ("chat", "plain")
TRUNCATABLE = ("document", "source", "question", "turn")


def _fill(template: str, fields: Mapping, task: str) -> str:
    try:
        return template.format(**fields)
    except KeyError as exc:
        raise SpecbenchError(f"the template for task '{task}' uses field {exc}, which these records lack",
                             f"use one of: {', '.join(fields)}") from exc


def render(query: Query, templates: Mapping[str, str], turn: int = 0, shots: Sequence[Query] = ()) -> str:
    template = templates.get(query.task, templates.get("default"))
    if template is None:
        raise SpecbenchError(f"no prompt template for task '{query.task}'",
                             f"add templates.<set>.{query.task} (known: {', '.join(templates)})")
    fields = dict(query.fields)
    if query.turns:
        fields["turn"] = query.turns[turn]
    text = _fill(template, fields, query.task)
    if shots:
        shot_tpl = templates.get("shot", "{question}\n{answer}")
        examples = [_fill(shot_tpl, {**s.fields, "answer": s.reference}, "shot") for s in shots]
        text = "\n\n".join([*examples, text])
    return text


def truncate_fields(query: Query, tokenizer, max_input_tokens: int | None) -> Query:
    """Cut over-long input fields to ``max_input_tokens`` tokens (logged)."""
    if not max_input_tokens:
        return query
    fields = dict(query.fields)
    for key in TRUNCATABLE:
        if key in fields and isinstance(fields[key], str):
            ids = tokenizer(fields[key], add_special_tokens=False)["input_ids"]
            if len(ids) > max_input_tokens:
                log.warning("query %s: %s has %d tokens, truncated to dataset.max_input_tokens=%d",
                            query.id, key, len(ids), max_input_tokens)
                fields[key] = tokenizer.decode(ids[:max_input_tokens])
    return Query(id=query.id, task=query.task, fields=fields, reference=query.reference, turns=query.turns,
                 category=query.category)


def build_prompt(query: Query, tokenizer, style: str, templates: Mapping[str, str], system: str | None = None, *,
                 turn: int = 0, history: Sequence[tuple[str, str]] = (), shots: Sequence[Query] = ()) -> list[int]:
    """Token ids of the prompt for ``query`` (its ``turn``-th user turn after ``history``:
    ``(user text, model answer)`` pairs of the earlier turns)."""
    text = render(query, templates, turn=turn, shots=shots if turn == 0 else ())
    if style == "chat":
        if not getattr(tokenizer, "chat_template", None):
            raise SpecbenchError("prompt style 'chat' but the tokenizer has no chat template",
                                 "set target.prompt.style=plain for this model")
        messages = [{"role": "system", "content": system}] if system else []
        for user, answer in history:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": text})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    if style == "plain":
        parts = [p for user, answer in history for p in (user, answer)]
        return list(tokenizer("\n\n".join([*parts, text]))["input_ids"])
    raise SpecbenchError(f"unknown prompt style '{style}'", f"use one of: {', '.join(STYLES)}")
