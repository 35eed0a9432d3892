"""Prompt formats: a task template fills the query's fields; the target's style wraps the text.

``style``: ``chat`` applies a chat template (system message, earlier turns with the model's own
answers, then the new user message): the target config's own ``chat_template`` (a Jinja string in
YAML, for models whose tokenizer ships none, such as Vicuna v1.3) or else the tokenizer's; ``plain``
tokenizes the text as is (T5-style task prefixes are plain templates). Templates live in the
``templates`` config and are picked by the query's ``kind`` (its record format's task); ``default``
serves any kind without its own; ``shot`` formats n-shot examples. ``check_templates`` renders every
query before a run decodes anything, so a template that does not fit some record stops the run
before the first generation, not minutes into it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from specbench.errors import SpecbenchError
from specbench.tasks.formats import Query
from specbench.tasks.registry import template_of

log = logging.getLogger(__name__)
STYLES = ("chat", "plain")
TRUNCATABLE = ("document", "source", "question", "turn", "prompt")


def _fill(template: str, fields: Mapping, task: str) -> str:
    try:
        return template.format(**fields)
    except KeyError as exc:
        raise SpecbenchError(
            f"the template for task '{task}' uses field {exc}, which these records lack",
            f"use one of: {', '.join(fields)}",
        ) from exc


def render(query: Query, templates: Mapping[str, str], turn: int = 0, shots: Sequence[Query] = ()) -> str:
    template = templates.get(template_of(query.kind), templates.get("default"))
    if template is None:
        raise SpecbenchError(
            f"no prompt template for task '{query.kind}'",
            f"add templates.<set>.{query.kind} (known: {', '.join(templates)})",
        )
    fields = dict(query.fields)
    if query.turns:
        fields["turn"] = query.turns[turn]
    text = _fill(template, fields, query.kind)
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
                log.warning(
                    "query %s: %s has %d tokens, truncated to dataset.max_input_tokens=%d",
                    query.id,
                    key,
                    len(ids),
                    max_input_tokens,
                )
                fields[key] = tokenizer.decode(ids[:max_input_tokens])
    return replace(query, fields=fields)


def check_templates(
    queries: Iterable[Query], templates: Mapping[str, str], max_turns: int = 1, shots: Sequence[Query] = ()
) -> None:
    """Render every turn of every query that a run will ask (up to ``max_turns``) without tokenizing:
    the first record a template does not fit stops the run here, naming it and how many more fail."""
    failures: list[tuple[Query, SpecbenchError]] = []
    for query in queries:
        for turn in range(max(1, min(len(query.turns), max_turns)) if query.turns else 1):
            try:
                render(query, templates, turn=turn, shots=shots if turn == 0 else ())
            except SpecbenchError as exc:
                failures.append((query, exc))
                break
    if failures:
        query, exc = failures[0]
        more = (
            f" ({len(failures) - 1} more of the {len(failures)} failing queries not shown)"
            if len(failures) > 1
            else ""
        )
        raise SpecbenchError(
            f"query {query.id} (task '{query.task}'): {exc.problem}{more}; nothing was decoded", exc.fix
        )


@dataclass(frozen=True)
class PromptFormat:
    """How a target's prompts are written: ``style`` (``chat`` or ``plain``), the template set (task template
    key -> template), the system prompt and ``chat_template`` (a Jinja chat template used instead of the
    tokenizer's, style ``chat``)."""

    style: str
    templates: Mapping[str, str]
    system: str | None = None
    chat_template: str | None = None


def build_prompt(
    query: Query,
    tokenizer,
    fmt: PromptFormat,
    *,
    turn: int = 0,
    history: Sequence[tuple[str, str]] = (),
    shots: Sequence[Query] = (),
) -> list[int]:
    """Token ids of the prompt for ``query`` in format ``fmt`` (its ``turn``-th user turn after ``history``:
    ``(user text, model answer)`` pairs of the earlier turns)."""
    style, system, chat_template = fmt.style, fmt.system, fmt.chat_template
    text = render(query, fmt.templates, turn=turn, shots=shots if turn == 0 else ())
    if style == "chat":
        if not chat_template and not getattr(tokenizer, "chat_template", None):
            raise SpecbenchError(
                "prompt style 'chat' but the tokenizer has no chat template",
                "give the target config a chat template (target.prompt.chat_template, as "
                "conf/target/vicuna_7b_v1_3.yaml does), or set target.prompt.style=plain",
            )
        messages = [{"role": "system", "content": system}] if system else []
        for user, answer in history:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": text})
        extra = {"chat_template": chat_template} if chat_template else {}
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **extra)
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    if style == "plain":
        parts = [p for user, answer in history for p in (user, answer)]
        return list(tokenizer("\n\n".join([*parts, text]))["input_ids"])
    raise SpecbenchError(f"unknown prompt style '{style}'", f"use one of: {', '.join(STYLES)}")


@dataclass
class Prompter:
    """A target's prompt builder: its tokenizer, prompt style, template set, system prompt, n-shot examples and chat
    template, applied to a query (and its turn and chat history)."""

    tokenizer: object
    style: str
    templates: dict
    system: str | None
    shots: list
    chat_template: str | None = None

    @property
    def prompt_format(self) -> PromptFormat:
        return PromptFormat(self.style, self.templates, self.system, self.chat_template)

    def __call__(self, query, turn: int = 0, history=()) -> list[int]:
        return build_prompt(
            query, self.tokenizer, self.prompt_format, turn=turn, history=history, shots=self.shots
        )

    def user_text(self, query, turn: int) -> str:
        return render(query, self.templates, turn=turn, shots=self.shots if turn == 0 else ())
