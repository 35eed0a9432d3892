"""Typed checks of a composed config, run before anything loads.

``validate(cfg, rules, locate)`` checks every key of ``rules`` that the config holds (a key a command's config
does not have is skipped), the keys that the class or builder of each ``_target_`` node declares in its signature
(``declared``: ``beta: Annotated[float, number(0)] = 1.0``), and every value left as ``???``, and raises one
``SpecbenchError`` naming each bad key, its value and what it takes. The rules are the ``Rule`` helpers here;
a config section's keys are the fields of the dataclasses declared beside the code that reads it (``section``:
decoding, the target, datasets, the training recipes, the commands' own sections), and ``schema(*tables)`` joins
them with ``SCHEMA`` (the keys that belong to no class); ``specbench.pipelines.keys`` holds every command's. A test
composes every config and fails on a key nothing types.
Only types and ranges live here; which names are valid (a drafter arm, a cascade rule, an alignment metric) is
checked by the code that uses them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, OmegaConfBaseException

from specbench.errors import SpecbenchError


@dataclass(frozen=True)
class Rule:
    test: Callable[[object], bool]
    expect: str  # "an integer >= 1"
    null: bool = False  # null (None) is allowed
    note: str = ""  # what the value means, for the error line: " (0: greedy)"
    keys: Mapping[str, Rule] = field(default_factory=dict)  # a mapping's own keys (``*``: any key)

    def ok(self, value) -> bool:
        return (value is None and self.null) or (value is not None and self.test(value))

    @property
    def expected(self) -> str:
        return f"{self.expect} or null" if self.null else self.expect


def _bounds(low, high, low_open: bool, high_open: bool = False) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    return f" {'<' if high_open else '<='} {high}" if high is not None else ""


def _within(x, low, high, low_open: bool, high_open: bool = False) -> bool:
    return (low is None or (x > low if low_open else x >= low)) and (
        high is None or (x < high if high_open else x <= high)
    )


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
    high_open: bool = False,
) -> Rule:
    """A finite int or float (not nan, not inf, not a bool)."""

    def test(v) -> bool:
        return (
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and math.isfinite(v)
            and _within(v, low, high, low_open, high_open)
        )

    return Rule(test, f"a finite number{_bounds(low, high, low_open, high_open)}", null, note)


def boolean() -> Rule:
    return Rule(lambda v: isinstance(v, bool), "true or false")


def text(null: bool = False) -> Rule:
    return Rule(lambda v: isinstance(v, str) and v != "", "a non-empty string", null)


def mapping(
    null: bool = False, note: str = "", expect: str = "a mapping", keys: Mapping[str, Rule] | None = None
) -> Rule:
    """A mapping; ``keys`` types its own keys (``*``: any key), or patterns ``<key>.*`` of a table do."""
    return Rule(lambda v: isinstance(v, dict), expect, null, note, dict(keys or {}))


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

# Keys that belong to no class: the commands' shared settings, paths and lists of names. A section a module reads
# is declared by its dataclasses beside it (``section``), and the arguments of a class or builder a config names by
# ``_target_`` in its own signature (``declared``); ``specbench.pipelines.keys`` joins them for every command.
SCHEMA: dict[str, Rule] = {
    "selector.name": text(),  # the method's name in the tables (taken off before the selector is built)
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


def schema(*tables: Mapping[str, Rule]) -> dict[str, Rule]:
    """``SCHEMA`` joined with ``tables`` (each a section's, ``section``). A key has one home: a pattern in two tables
    is an error (the second would silently replace the first's rule)."""
    full = dict(SCHEMA)
    for table in tables:
        for pattern, rule in table.items():
            if pattern in full:
                raise RuntimeError(f"config key {pattern} is typed twice")
            full[pattern] = rule
    return full


def declared(fn: Callable) -> dict[str, Rule]:
    """The config keys a class or builder declares beside itself: each parameter of its signature annotated
    ``Annotated[type, rule]`` (a class: the ``__init__`` of it and of its bases, which ``**kwargs`` reaches; a
    subclass's rule replaces its base's; a dataclass: its fields), and a mapping rule's own keys as
    ``<name>.<key>``. This one declaration is what ``validate`` checks in a config and ``check_arguments`` in the
    arguments a config builds it with."""
    if dataclasses.is_dataclass(fn):
        inits = [fn]
    elif isinstance(fn, type):
        inits = [
            vars(c)["__init__"] for c in reversed(fn.__mro__) if c is not object and "__init__" in vars(c)
        ]
    else:
        inits = [fn]
    keys: dict[str, Rule] = {}
    for init in inits:
        for name, hint in typing.get_type_hints(init, include_extras=True).items():
            for rule in getattr(hint, "__metadata__", ()):
                if isinstance(rule, Rule):
                    keys.update(_flatten(name, rule))
    return keys


def section(at: str, *classes: type) -> dict[str, Rule]:
    """The key patterns of the config section ``at`` (``""``: the top level) as ``classes`` declare them: each a
    dataclass whose fields are the section's keys (``Annotated[type, rule]``), the schema of the YAML that holds
    the section's defaults (conf/<group>/), as a structured config is Hydra's."""
    return {f"{at}.{key}" if at else key: rule for cls in classes for key, rule in _declared(cls).items()}


# config sections by where they sit in a config ("": the top level), each with the dataclasses that declare its keys
Sections = Mapping[str, tuple[type, ...]]


def tables(sections: Sections) -> list[dict[str, Rule]]:
    """Each section's key patterns (``section``), for ``schema`` to join (a key typed twice is refused there)."""
    return [section(at, *classes) for at, classes in sections.items()]


def nested(cls: type, null: bool = False, note: str = "", expect: str = "a mapping") -> Rule:
    """A mapping whose own keys the dataclass ``cls`` declares (a sub-section: target.prompt, a dataset's source)."""
    return mapping(null=null, note=note, expect=expect, keys=declared(cls))


def each(item: Rule, null: bool = False, note: str = "", expect: str = "a mapping") -> Rule:
    """A mapping of any keys to values that ``item`` types (``*``): template sets, tolerances per dtype."""
    return mapping(null=null, note=note, expect=expect, keys={"*": item})


def _flatten(name: str, rule: Rule) -> dict[str, Rule]:
    keys = {name: rule}
    for key, sub in rule.keys.items():
        keys.update(_flatten(f"{name}.{key}", sub))
    return keys


def check_arguments(fn: Callable, arguments: Mapping, at: str) -> None:
    """Raise one ``SpecbenchError`` for the values of ``arguments`` (the keyword arguments a config at ``at`` builds
    ``fn`` with, e.g. a selector of ``methods=``) that break the rules ``fn`` declares; the same words as
    ``validate``'s, the keys named ``<at>.<key>``. Plain Python over the values (a dataclass checks itself with it
    in ``__post_init__``, at the cost of a few microseconds)."""
    if isinstance(arguments, DictConfig):
        arguments = OmegaConf.to_container(arguments, resolve=True)
    _report(
        [
            _refusal(f"{at}.{key}", value, rule)
            for pattern, rule in _declared(fn).items()
            for key, value in _pick(arguments, pattern.split("."))
            if not rule.ok(value)
        ]
    )


def _refusal(key: str, value, rule: Rule) -> tuple[str, str]:
    """The error line and the fix of a value its rule refuses."""
    return f"{key}={_show(value)}: expected {rule.expected}{rule.note}", f"{key}=<{rule.expected}>"


def _report(refused: list[tuple[str, str]]) -> None:
    """One ``SpecbenchError`` for every ``(problem, fix)`` of ``refused``, if any."""
    if refused:
        raise SpecbenchError(
            "\n       ".join(p for p, _ in refused),
            "set " + " ".join(f for _, f in refused) + " (on the command line or in the config)",
        )


@functools.cache
def _declared(fn: Callable) -> dict[str, Rule]:
    """``declared``, read once per class or builder (its type hints are evaluated on each call)."""
    return declared(fn)


def _pick(values, parts: list[str], prefix: str = "") -> Iterator[tuple[str, object]]:
    """``(dotted key, value)`` of each value of the nested mapping ``values`` that a pattern's ``parts`` name."""
    if not parts:
        yield prefix, (list(values) if isinstance(values, tuple) else values)
        return
    if not isinstance(values, Mapping):
        return
    names = list(values) if parts[0] == "*" else [parts[0]] if parts[0] in values else []
    for name in names:
        yield from _pick(values[name], parts[1:], f"{prefix}.{name}" if prefix else str(name))


def validate(
    cfg: DictConfig,
    rules: Mapping[str, Rule] | None = None,
    locate: Callable[[str], Callable | None] | None = None,
) -> None:
    """Raise one ``SpecbenchError`` listing every value of ``cfg`` that breaks ``rules`` (default: ``SCHEMA``) or,
    with ``locate`` (a ``_target_`` -> its class or builder, or None to leave it), the rules the ``_target_`` of its
    node declares (``declared``), or is left as ``???`` (a value the user must supply)."""
    rules = SCHEMA if rules is None else rules
    missing = list(_missing(OmegaConf.to_container(cfg, resolve=False)))
    problems = [f"{key} is not set (the config leaves it as ???)" for key in missing]
    fixes = [f"{key}=<value>" for key in missing]
    for key, rule in typed(cfg, rules, locate):
        if key in missing:
            continue
        try:
            value = OmegaConf.select(cfg, key, throw_on_missing=True)
            if isinstance(value, ListConfig):
                value = OmegaConf.to_container(value, resolve=True)
            elif isinstance(value, DictConfig):  # a mapping's own keys are checked (and resolved) by theirs
                value = OmegaConf.to_container(value, resolve=False)
        except InterpolationToMissingValueError:  # points at a ??? value, reported above
            continue
        except OmegaConfBaseException as exc:  # an interpolation that does not resolve
            problems.append(f"{key}: {_first_line(exc)}")
            fixes.append(f"{key}=<{rule.expected}>")
            continue
        if not rule.ok(value):
            problem, fix = _refusal(key, value, rule)
            problems.append(problem)
            fixes.append(fix)
    _report(list(zip(problems, fixes)))


def typed(
    cfg: DictConfig, rules: Mapping[str, Rule], locate: Callable[[str], Callable | None] | None = None
) -> Iterator[tuple[str, Rule]]:
    """Each key of ``cfg`` that a rule types, with that rule: the patterns of ``rules``, then (with ``locate``) the
    keys declared by the callable of each ``_target_`` node."""
    for pattern, rule in rules.items():
        for key in _expand(cfg, pattern):
            yield key, rule
    if locate is None:
        return
    for at, target in _targets(OmegaConf.to_container(cfg, resolve=False)):
        try:
            fn = locate(target)
        except ImportError:  # a _target_ that does not import: instantiate names it, where it is built
            continue
        for name, rule in _declared(fn).items() if fn is not None else ():
            for key in _expand(cfg, f"{at}.{name}" if at else name):
                yield key, rule


def _targets(node, prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted key, _target_)`` of each mapping in a config turned into containers that names a ``_target_``."""
    if not isinstance(node, dict):
        return
    if isinstance(node.get("_target_"), str):
        yield prefix, node["_target_"]
    for key, value in node.items():
        yield from _targets(value, f"{prefix}.{key}" if prefix else str(key))


def _expand(cfg: DictConfig, pattern: str) -> list[str]:
    """The keys of ``cfg`` that ``pattern`` names (``*``: any key of a mapping at that level)."""
    keys = [""]
    for part in pattern.split("."):
        nxt = []
        for prefix in keys:
            node = OmegaConf.select(cfg, prefix, throw_on_missing=False) if prefix else cfg
            if not isinstance(node, DictConfig):
                continue
            # every key, ??? values too (``in`` on a DictConfig leaves those out)
            names = [str(k) for k in node if part in ("*", str(k))]
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
