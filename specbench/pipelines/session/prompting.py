"""From queries to prompt ids: the target's EOS ids, its context window (``Context``: fitting each prompt and
its new tokens), the prompt builder (``Prompter``: templates, shots, truncation) and the fingerprints records
carry of each prompt and query."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, replace

from omegaconf import DictConfig

from specbench.decoding.loop import Limits
from specbench.errors import SpecbenchError
from specbench.models import Target, load_model
from specbench.models.loading import LoadedModel
from specbench.tasks import Prompter, check_templates, load_dataset_config, load_shots, truncate_fields

log = logging.getLogger(__name__)


def eos_ids_of(loaded: LoadedModel, extra=(), vocab_size: int | None = None) -> frozenset[int]:
    """The model's EOS ids plus ``extra`` (``decoding.extra_eos_ids``), each checked to be a token id
    of a vocabulary of ``vocab_size`` when given."""
    ids = set()
    for source in (
        loaded.tokenizer.eos_token_id,
        getattr(loaded.model.generation_config, "eos_token_id", None),
    ):
        if source is None:
            continue
        ids.update(source if isinstance(source, (list, tuple)) else [source])
    for x in extra or ():
        if (
            isinstance(x, bool)
            or not isinstance(x, int)
            or x < 0
            or (vocab_size is not None and x >= vocab_size)
        ):
            vocab = (
                f"the target's vocabulary has {vocab_size} tokens (ids 0..{vocab_size - 1})"
                if vocab_size is not None
                else "token ids are whole numbers >= 0"
            )
            raise SpecbenchError(
                f"decoding.extra_eos_ids: {x!r} is not a token id: {vocab}",
                "list token ids of the target's tokenizer in decoding.extra_eos_ids",
            )
        ids.add(x)
    return frozenset(int(i) for i in ids)


# The model-config fields read for a target's context length when its config (conf/target/) sets no
# ``context_keys``; a target with relative positions and no hard limit (T5) sets ``context_keys: []``.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions")


@dataclass(frozen=True)
class Context:
    """How many positions a model can attend to: ``limit`` from the model-config field ``key``
    (None: no hard limit). ``check`` refuses a prompt that does not fit with its new tokens."""

    limit: int | None = None
    key: str | None = None
    model: str = "the model"

    @classmethod
    def of(cls, model_config, keys, model: str = "the model", limit: int | None = None) -> Context:
        """The first of ``keys`` that ``model_config`` sets to a positive whole number; else ``limit`` (the target
        config's ``context_limit``: a bound for models without a hard one, such as T5's relative positions, whose
        attention over a 54k-token input would try to allocate tens of GB)."""
        for key in keys:
            value = getattr(model_config, str(key), None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return cls(value, str(key), model)
        if limit:
            return cls(int(limit), "target.context_limit", model)
        return cls(model=model)

    def fit(
        self,
        query_id: str,
        prompt_len: int,
        limits: Limits,
        encoder_decoder: bool = False,
        shorten: bool = False,
    ) -> Limits:
        """``limits`` when the prompt and its new tokens fit; with ``shorten`` (``decoding.fit_context``), a
        decoder-only generation that would overrun the context gets the positions left (at least one) as
        its ``max_new_tokens``; otherwise ``check`` refuses it."""
        room = None if self.limit is None else self.limit - prompt_len
        if shorten and not encoder_decoder and room is not None and 1 <= room < limits.max_new_tokens:
            return replace(limits, max_new_tokens=room)
        self.check(query_id, prompt_len, limits.max_new_tokens, encoder_decoder, shorten)
        return limits

    def check(
        self,
        query_id: str,
        prompt_len: int,
        max_new_tokens: int,
        encoder_decoder: bool = False,
        fitting: bool = False,
    ) -> None:
        """SpecbenchError unless the prompt (the encoder input of an encoder-decoder model) and the
        ``max_new_tokens`` it may generate fit in ``limit`` positions."""
        if self.limit is None:
            return
        needed = max(prompt_len, 1 + max_new_tokens) if encoder_decoder else prompt_len + max_new_tokens
        if needed <= self.limit:
            return
        room = self.limit if encoder_decoder else self.limit - max_new_tokens
        raise SpecbenchError(
            f"query {query_id}: its prompt has {prompt_len:,} tokens, and with max_new_tokens={max_new_tokens} "
            f"it needs {needed:,} positions: more than the {self.limit:,} of {self.model}"
            + (
                " (target.context_limit: it has no hard limit, but attention over more would need GBs)"
                if self.key == "target.context_limit"
                else f" ({self.key} in its model config)"
            ),
            f"cut long inputs with dataset.max_input_tokens=<n> (each document / source / question / turn is "
            f"truncated to n tokens; the prompt template adds its own, and {max(room, 0):,} positions are left for "
            f"the whole prompt), lower max_new_tokens, "
            + (
                ""
                if fitting or encoder_decoder
                else "let each generation stop at the context's end with decoding.fit_context=true, "
            )
            + "or leave that record out of the data file",
        )


def prompt_fingerprint(ids) -> str:
    """A short hash of a prompt's token ids."""
    return hashlib.sha256(json.dumps([int(i) for i in ids]).encode()).hexdigest()[:16]


def query_fingerprint(query) -> str:
    """A short hash of everything of a query that a record is made from: its kind, fields and turns (the
    prompt) and its reference (the quality scores)."""
    blob = json.dumps(
        [query.kind, query.fields, query.turns, query.reference, query.task],
        sort_keys=True,
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def turns_of(query, max_turns: int) -> int:
    return max(1, min(len(query.turns), max_turns)) if query.turns else 1


def example_id(query, turn: int) -> str:
    return query.id if turn == 0 else f"{query.id}/turn{turn + 1}"


@dataclass
class Inputs:
    """What every command that prompts the target loads first: the queries, the target and the prompt builder."""

    queries: list
    loaded: LoadedModel
    target: Target
    prompter: Prompter


def load_inputs(cfg: DictConfig, max_input_tokens: int | None) -> Inputs:
    """The queries of ``cfg.dataset``, each record checked against its template before the (slow) model load, then
    the target, the queries truncated to ``max_input_tokens`` of its tokenizer, and the prompt builder (the
    template set, the dataset's n-shot examples, the target's prompt style): the one load sequence of ``Session``
    and ``specbench train-drafter``."""
    queries = load_dataset_config(cfg.dataset)
    if cfg.target.prompt.templates not in cfg.templates:
        raise SpecbenchError(
            f"unknown template set '{cfg.target.prompt.templates}'",
            f"set target.prompt.templates to one of: {', '.join(cfg.templates)}",
        )
    templates = cfg.templates[cfg.target.prompt.templates]
    shots = load_shots(cfg.dataset, int(cfg.dataset.get("n_shot") or 0))
    check_templates(queries, templates, int(cfg.dataset.get("max_turns") or 1), shots)
    log.info("loading target %s", cfg.target.model)
    loaded = load_model(cfg.target.model, dtype=cfg.target.dtype, device=cfg.target.device)
    queries = [truncate_fields(q, loaded.tokenizer, max_input_tokens) for q in queries]
    prompter = Prompter(
        loaded.tokenizer,
        cfg.target.prompt.style,
        templates,
        cfg.target.prompt.get("system"),
        shots,
        cfg.target.prompt.get("chat_template"),
    )
    return Inputs(queries, loaded, Target(loaded), prompter)
