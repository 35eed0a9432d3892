"""Typed checks of a composed config, run before anything loads.

``validate(cfg)`` checks every key of ``SCHEMA`` that the config holds (one table for every
command: a key a command's config does not have is skipped) and every value left as ``???``, and
raises one ``SpecbenchError`` naming each bad key, its value and what it takes. Only types and
ranges live here; which names are valid (a drafter arm, a cascade rule, an alignment metric) is
checked by the code that uses them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, OmegaConfBaseException

from specbench.decoding.sampling import MIN_TEMPERATURE
from specbench.errors import SpecbenchError


@dataclass(frozen=True)
class Rule:
    test: Callable[[object], bool]
    expect: str  # "an integer >= 1"
    null: bool = False  # null (None) is allowed
    note: str = ""  # what the value means, for the error line: " (0: greedy)"

    def ok(self, value) -> bool:
        return (value is None and self.null) or (value is not None and self.test(value))

    @property
    def expected(self) -> str:
        return f"{self.expect} or null" if self.null else self.expect


def _bounds(low, high, low_open: bool) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}]"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    return f" <= {high}" if high is not None else ""


def _within(x, low, high, low_open: bool) -> bool:
    return (low is None or (x > low if low_open else x >= low)) and (high is None or x <= high)


def integer(low: int | None = None, high: int | None = None, null: bool = False, note: str = "") -> Rule:
    """An int (not a bool, not 2.9: a float is never silently cut to an int)."""
    def test(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and _within(v, low, high, False)
    return Rule(test, f"an integer{_bounds(low, high, False)}", null, note)


def number(low: float | None = None, high: float | None = None, null: bool = False, low_open: bool = False,
           note: str = "") -> Rule:
    """A finite int or float (not nan, not inf, not a bool)."""
    def test(v) -> bool:
        return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and _within(v, low, high, low_open))
    return Rule(test, f"a finite number{_bounds(low, high, low_open)}", null, note)


def boolean() -> Rule:
    return Rule(lambda v: isinstance(v, bool), "true or false")


def text(null: bool = False) -> Rule:
    return Rule(lambda v: isinstance(v, str) and v != "", "a non-empty string", null)


def list_of(item: Rule, null: bool = False) -> Rule:
    return Rule(lambda v: isinstance(v, list) and all(item.ok(x) for x in v), f"a list, each {item.expect}", null)


def one_or_list(item: Rule, null: bool = False) -> Rule:
    many = list_of(item)
    return Rule(lambda v: item.ok(v) or many.ok(v), f"{item.expect} or {many.expect}", null)


MAX_TIE_TOLERANCE = 8.0  # logits: 8x the largest bf16 rounding gap measured on SmolLM2 (profile.rounding)

SEED = integer(0)
COUNT = integer(1)
PATH = text(null=True)

# Keys users type, for every command's root config (conf/<command>.yaml) and the groups it composes.
SCHEMA: dict[str, Rule] = {
    "seed": SEED,
    "paths.data": text(),
    "threads": integer(1, null=True, note=" (null: torch's default)"),
    "warmup.max_new_tokens": integer(0, note=" (0: no warm-up)"),
    "timing.phases": boolean(),
    "methods": list_of(text()),
    "conversation_length": integer(1, note=" (queries per conversation)"),
    "policy.checkpoint": PATH,
    "overwrite": boolean(),
    "spec_bench_answers": boolean(),
    "name": text(null=True),
    "out": PATH,
    "data": one_or_list(text(), null=True),
    "drafters": list_of(text(), null=True),
    "drafter_arm": text(),
    "tasks": list_of(text(), null=True),
    "rules": list_of(text()),
    "alphas.*": list_of(number()),
    "profile_path": PATH,
    # profile
    "profile.q": Rule(lambda v: list_of(integer(1)).ok(v) and len(v) > 0, "a non-empty list, each an integer >= 1",
                      note=" (new tokens per target forward)"),
    "profile.contexts": Rule(lambda v: list_of(integer(1)).ok(v) and len(v) > 0,
                             "a non-empty list, each an integer >= 1", note=" (context lengths in tokens)"),
    "profile.repeats": COUNT,
    "trace.draft_length": integer(1, null=True, note=" (null: each drafter's own draft length)"),
    "trace.side_observations": boolean(),
    "trace.costs.contexts": Rule(lambda v: list_of(integer(1)).ok(v) and len(v) > 0,
                                 "a non-empty list, each an integer >= 1"),
    "trace.costs.q": Rule(lambda v: list_of(integer(1)).ok(v) and len(v) > 0, "a non-empty list, each an integer >= 1"),
    "trace.costs.catch_up": Rule(lambda v: list_of(integer(1)).ok(v), "a list, each an integer >= 1"),
    "trace.costs.repeats": COUNT,
    "trace.costs.warmup": integer(0),
    "seeds": COUNT,
    "replay.max_new_tokens": integer(1, null=True, note=" (null: the trace's)"),
    "replay.draft_length": integer(1, null=True, note=" (null: the trace run's)"),
    "traces": PATH,
    "profile.warmup": integer(0),
    "profile.draft_tokens": COUNT,
    "profile.tokens": text(),
    "profile.run": PATH,
    "profile.rounding.prompts": integer(0),
    "profile.rounding.new_tokens": COUNT,
    "profile.rounding.chunk": integer(2),
    # target
    "target.model": text(),
    "target.dtype": text(null=True),
    "target.device": text(null=True),
    "target.layers_key": text(),
    "target.head_scale": number(low=0, low_open=True),
    "target.context_limit": integer(1, null=True, note=" (positions, for models whose config sets no hard limit)"),
    # the largest logit gap a bf16/fp32 rounding can make, per dtype: forks within it are ties, beyond it defects
    "target.tie_tolerance": Rule(lambda v: isinstance(v, dict), "a mapping of dtype to tolerance",
                                 null=True, note=" (e.g. {float32: 1.0e-4, bfloat16: 1.0})"),
    "target.tie_tolerance.*": number(0, MAX_TIE_TOLERANCE, low_open=True, null=True,
                                     note=" (logit units; `specbench profile` measures it: about 1 in bf16, 1e-4 in "
                                          "fp32; a larger one would call real defects ties)"),
    "target.prompt.style": text(),
    "target.prompt.templates": text(),
    "target.prompt.system": text(null=True),
    "target.prompt.chat_template": text(null=True),
    # decoding
    "decoding.temperature": Rule(lambda v: number(0).ok(v) and (v == 0 or v >= MIN_TEMPERATURE),
                                 f"a finite number >= 0: 0 (greedy) or at least {MIN_TEMPERATURE:g}",
                                 note=f" (below {MIN_TEMPERATURE:g} the scaled logits overflow float32)"),
    "decoding.top_k": integer(0, note=" (0: off)"),
    "decoding.top_p": number(0, 1, low_open=True),
    "decoding.max_new_tokens": COUNT,
    "decoding.draft_length": integer(1, note=" (tokens drafted per round)"),
    "decoding.extra_eos_ids": list_of(integer(0), null=True),
    "decoding.fit_context": boolean(),
    # dataset
    "dataset.path": PATH,
    "dataset.split": text(null=True),
    "dataset.limit": integer(1, null=True, note=" (per source; null: all)"),
    "dataset.offset": integer(0),
    "dataset.shuffle": boolean(),
    "dataset.interleave": boolean(),
    "dataset.seed": SEED,
    "dataset.categories": list_of(text(), null=True),
    "dataset.max_input_tokens": integer(1, null=True, note=" (null: no truncation)"),
    "dataset.max_turns": COUNT,
    "dataset.n_shot": integer(0),
    "dataset.source_lang": text(),
    "dataset.target_lang": text(),
    "dataset.sources.*.path": PATH,
    "dataset.sources.*.limit": integer(1, null=True, note=" (per source; null: all)"),
    "dataset.sources.*.offset": integer(0),
    "dataset.sources.*.shuffle": boolean(),
    "dataset.sources.*.max_chars": integer(1, note=" (python_functions: the longest function source kept)"),
    "dataset.sources.*.exclude_entry_points": PATH,
    # pool: every drafter of the pool
    "pool.drafters.*.confidence_threshold": number(0, 1, note=" (a drafter probability: 0 drafts every token)"),
    # cascade and selector knobs
    "cascade.rule": text(),
    "cascade.alpha": number(),
    "selector.seed": SEED,
    "selector.candidates": list_of(text(), null=True),
    "selector.include_autoregressive": boolean(),
    "selector.carry_over": boolean(),
    "selector.decay": number(0, 1),
    "selector.full_information": boolean(),
    "selector.sample": boolean(),
    "selector.beta": number(0),
    "selector.epsilon": number(0, 1),
    "selector.gamma": number(0, 1),
    "selector.delta": number(0, 1, null=True, low_open=True),
    "selector.window": COUNT,
    "selector.m": COUNT,
    "selector.budget": COUNT,
    "selector.checkpoint": PATH,
    "selector.switch_cost": number(0),
    "selector.per_query": boolean(),
    # collect
    "collect.max_new_tokens": integer(1, null=True, note=" (null: decoding.max_new_tokens)"),
    "collect.alignment": text(),
    "collect.measure_speculative": boolean(),
    "collect.trace": text(null=True),
    "collect.shard": integer(0),
    "collect.num_shards": COUNT,
    "collect.overwrite": boolean(),
    "embedding.pooling": text(),
    # train-policy
    "reward.alpha": number(0, 1),
    "reward.cost": text(),
    "reward.source": text(),
    "reward.alignment": text(),
    "train.arms": list_of(text(), null=True),
    "train.hidden": list_of(integer(1)),
    "train.epochs": integer(0),
    "train.lr": number(0, low_open=True, null=True, note=" (train-drafter: null is the kind's default)"),
    "train.batch_size": COUNT,
    "train.entropy": number(0),
    "train.baseline": text(),
    "train.weight_decay": number(0),
    "train.dropout": number(0, 1),
    "train.seed": SEED,
    "train.val_fraction": number(0, 1),
    "train.n_examples": integer(1, null=True),
    "train.standardize": boolean(),
    "train.allow_incomplete": boolean(),
    "sweep.alpha": list_of(number(0, 1), null=True),
    "sweep.n_examples": list_of(integer(1), null=True),
    # train-drafter
    "drafter.kind": text(),
    "drafter.layers": COUNT,
    "drafter.vocab": integer(1, null=True, note=" (null: the full vocabulary)"),
    "drafter.model": text(null=True),
    "train.loss": text(),
    "train.responses": text(),
    "train.max_new_tokens": COUNT,
    "train.max_input_tokens": COUNT,
    "train.max_tokens": COUNT,
    "train.seq_len": COUNT,
    "train.time_budget_s": number(0, null=True, low_open=True),
    "train.feature_weight": number(0),
    "train.ce_weight": number(0),
    "train.top_k": COUNT,
    "train.unroll": integer(1, 16),
    "train.unroll_weights": list_of(number(0), null=True),
    "train.feature_noise": number(0),
    "train.val_examples": integer(0),
    "train.prompt_positions": boolean(),
    "train.precision": text(),
    "train.lr_schedule": text(),
    "train.generate_batch": COUNT,
    "train.generate_only": boolean(),
}


def validate(cfg: DictConfig, schema: dict[str, Rule] = SCHEMA) -> None:
    """Raise one ``SpecbenchError`` listing every value of ``cfg`` that breaks ``schema`` or is
    left as ``???`` (a value the user must supply)."""
    missing = list(_missing(OmegaConf.to_container(cfg, resolve=False)))
    problems = [f"{key} is not set (the config leaves it as ???)" for key in missing]
    fixes = [f"{key}=<value>" for key in missing]
    for pattern, rule in schema.items():
        for key in _expand(cfg, pattern):
            if key in missing:
                continue
            try:
                value = OmegaConf.select(cfg, key, throw_on_missing=True)
            except InterpolationToMissingValueError:  # points at a ??? value, reported above
                continue
            except OmegaConfBaseException as exc:  # an interpolation that does not resolve
                problems.append(f"{key}: {_first_line(exc)}")
                fixes.append(f"{key}=<{rule.expected}>")
                continue
            if isinstance(value, (DictConfig, ListConfig)):
                value = OmegaConf.to_container(value, resolve=True)
            if not rule.ok(value):
                problems.append(f"{key}={_show(value)}: expected {rule.expected}{rule.note}")
                fixes.append(f"{key}=<{rule.expected}>")
    if problems:
        raise SpecbenchError("\n       ".join(problems), "set " + " ".join(fixes) + " (on the command line or in the config)")


def _expand(cfg: DictConfig, pattern: str) -> list[str]:
    """The keys of ``cfg`` that ``pattern`` names (``*``: any key of a mapping at that level)."""
    keys = [""]
    for part in pattern.split("."):
        nxt = []
        for prefix in keys:
            node = OmegaConf.select(cfg, prefix, throw_on_missing=False) if prefix else cfg
            if not isinstance(node, DictConfig):
                continue
            names = [str(k) for k in node.keys()] if part == "*" else [part] if part in node else []
            nxt += [f"{prefix}.{n}" if prefix else n for n in names]
        keys = nxt
    return keys


def _missing(node, prefix: str = "") -> Iterator[str]:
    """The dotted keys whose value is ``???`` in a config turned into containers (not resolved)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        full = f"{prefix}.{key}" if prefix else str(key)
        if value == "???":
            yield full
        else:
            yield from _missing(value, full)


def _show(value) -> str:
    if isinstance(value, str):
        return value if value.strip() else repr(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
