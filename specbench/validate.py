"""Typed checks of a composed config, run before anything loads.

``validate(cfg)`` checks every key of ``schema()`` that the config holds (a key a command's config does not
have is skipped) and every value left as ``???``, and raises one ``SpecbenchError`` naming each bad key, its
value and what it takes. ``schema()`` joins ``SCHEMA`` (the keys that belong to no class) and the ``KEYS``
table beside each class that reads config keys (``TABLES``: selectors, drafters, the target, datasets, the
training recipes, the commands' own sections), built from the ``Rule`` helpers here; a test composes every
config and fails on a key no pattern types. Only types and ranges live here; which names are valid (a drafter
arm, a cascade rule, an alignment metric) is checked by the code that uses them.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, OmegaConfBaseException

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


def number(
    low: float | None = None,
    high: float | None = None,
    null: bool = False,
    low_open: bool = False,
    note: str = "",
) -> Rule:
    """A finite int or float (not nan, not inf, not a bool)."""

    def test(v) -> bool:
        return (
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and math.isfinite(v)
            and _within(v, low, high, low_open)
        )

    return Rule(test, f"a finite number{_bounds(low, high, low_open)}", null, note)


def boolean() -> Rule:
    return Rule(lambda v: isinstance(v, bool), "true or false")


def text(null: bool = False) -> Rule:
    return Rule(lambda v: isinstance(v, str) and v != "", "a non-empty string", null)


def mapping(null: bool = False, note: str = "", expect: str = "a mapping") -> Rule:
    """A mapping (its keys are typed by their own patterns, ``<key>.*``)."""
    return Rule(lambda v: isinstance(v, dict), expect, null, note)


def list_of(item: Rule, null: bool = False) -> Rule:
    return Rule(
        lambda v: isinstance(v, list) and all(item.ok(x) for x in v), f"a list, each {item.expect}", null
    )


def nonempty_list_of(item: Rule, note: str = "") -> Rule:
    return Rule(
        lambda v: list_of(item).ok(v) and len(v) > 0, f"a non-empty list, each {item.expect}", note=note
    )


def one_or_list(item: Rule, null: bool = False) -> Rule:
    many = list_of(item)
    return Rule(lambda v: item.ok(v) or many.ok(v), f"{item.expect} or {many.expect}", null)


MAX_TIE_TOLERANCE = 8.0  # logits: 8x the largest bf16 rounding gap measured on SmolLM2 (profile.rounding)

SEED = integer(0)
COUNT = integer(1)
PATH = text(null=True)

# Keys that belong to no class: the commands' shared settings, paths and lists of names. The keys a class reads
# live in a ``KEYS`` table beside it (the modules of ``TABLES``); ``schema()`` joins them all.
SCHEMA: dict[str, Rule] = {
    "seed": SEED,
    "paths.data": text(),
    "run_name": text(),  # the run directory's folder under outputs/ (conf/hydra/run_dirs.yaml)
    "splits.*": text(),  # an experiment's split per command, picked by run_name (huang_t5, huang_gsm8k_qwen)
    "commands": list_of(text()),  # the commands an experiment is written for (configs.experiment_commands)
    "threads": integer(1, null=True, note=" (null: torch's default)"),
    "warmup.max_new_tokens": integer(0, note=" (0: no warm-up)"),
    "timing.phases": boolean(),
    "methods": list_of(text()),
    "selector_overrides": mapping(
        null=True, note=" (merged into each selector of methods=, e.g. {carry_over: true})"
    ),
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
    "pool.from_policy": boolean(),  # conf/pool/auto.yaml: eval's pool a policy's own may replace
    "quality_metric": mapping(
        null=True, note=" (task -> a column of its metric, e.g. {summarization: rouge1})"
    ),
    "quality_metric.*": text(),
    "profile_path": PATH,
}

# The modules whose ``KEYS`` table types the keys their classes read: imported at the first ``schema()``, not
# with this module (most import torch, some transformers; the door imports validate before anything loads).
TABLES = (
    "specbench.decoding.sampling",  # decoding.*
    "specbench.decoding.cascade",  # cascade.*
    "specbench.selection.base",  # selector.*: every selector's knobs, one table (a key means one thing)
    "specbench.drafters",  # pool.drafters.*.*: every drafter builder's arguments
    "specbench.models.target",  # target.*
    "specbench.tasks.datasets",  # dataset.*
    "specbench.policy.model",  # train-policy: train.*, reward.*, sweep.*
    "specbench.training.trainees",  # train-drafter: drafter.*, its own train.*, eval_sets.*
    "specbench.pipelines.collect",  # collect.*, embedding.*
    "specbench.pipelines.profile",  # profile.*
    "specbench.pipelines.trace",  # trace.*
    "specbench.pipelines.replay",  # replay.*, seeds, traces
)


# the tables whose modules load no more than torch (no transformers, no pipeline): what the command line checks
# before it imports the pipeline (cli.hydra_run), so that a bad value of these keys is answered in about a second
LIGHT_TABLES = (
    "specbench.decoding.sampling",
    "specbench.decoding.cascade",
    "specbench.selection.base",
    "specbench.tasks.datasets",
    "specbench.policy.model",
)


def schema(tables: tuple[str, ...] = TABLES) -> dict[str, Rule]:
    """Every typed key: ``SCHEMA`` and each module's ``KEYS`` of ``tables`` (default: all of ``TABLES``). A key has
    one home: a pattern in two tables is an error (the second would silently replace the first's rule)."""
    full = dict(SCHEMA)
    for module in tables:
        for pattern, rule in importlib.import_module(module).KEYS.items():
            if pattern in full:
                raise RuntimeError(
                    f"config key {pattern} is typed twice ({module}.KEYS and an earlier table)"
                )
            full[pattern] = rule
    return full


def validate(cfg: DictConfig, rules: dict[str, Rule] | None = None) -> None:
    """Raise one ``SpecbenchError`` listing every value of ``cfg`` that breaks ``rules`` (default: ``schema()``,
    every typed key) or is left as ``???`` (a value the user must supply)."""
    rules = schema() if rules is None else rules
    missing = list(_missing(OmegaConf.to_container(cfg, resolve=False)))
    problems = [f"{key} is not set (the config leaves it as ???)" for key in missing]
    fixes = [f"{key}=<value>" for key in missing]
    for pattern, rule in rules.items():
        for key in _expand(cfg, pattern):
            if key in missing:
                continue
            try:
                value = OmegaConf.select(cfg, key, throw_on_missing=True)
                if isinstance(value, ListConfig):
                    value = OmegaConf.to_container(value, resolve=True)
                elif isinstance(
                    value, DictConfig
                ):  # a mapping's own keys are checked (and resolved) by theirs
                    value = OmegaConf.to_container(value, resolve=False)
            except InterpolationToMissingValueError:  # points at a ??? value, reported above
                continue
            except OmegaConfBaseException as exc:  # an interpolation that does not resolve
                problems.append(f"{key}: {_first_line(exc)}")
                fixes.append(f"{key}=<{rule.expected}>")
                continue
            if not rule.ok(value):
                problems.append(f"{key}={_show(value)}: expected {rule.expected}{rule.note}")
                fixes.append(f"{key}=<{rule.expected}>")
    if problems:
        raise SpecbenchError(
            "\n       ".join(problems), "set " + " ".join(fixes) + " (on the command line or in the config)"
        )


def _expand(cfg: DictConfig, pattern: str) -> list[str]:
    """The keys of ``cfg`` that ``pattern`` names (``*``: any key of a mapping at that level)."""
    keys = [""]
    for part in pattern.split("."):
        nxt = []
        for prefix in keys:
            node = OmegaConf.select(cfg, prefix, throw_on_missing=False) if prefix else cfg
            if not isinstance(node, DictConfig):
                continue
            names = [str(k) for k in node] if part == "*" else [part] if part in node else []
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
