"""Every YAML key has a typed home (issue 35): each root config of conf/, each root with each experiment written
for it, and each option of each group is composed, and every leaf key must be typed: by a pattern of
``specbench.pipelines.keys.every_key()`` (a field of the dataclass that declares a section beside the module that
reads it, or ``SCHEMA`` for the keys that belong to no class), by the signature of its node's ``_target_`` (a selector class, a drafter
builder: ``validate.declared``), or be one of the few exemptions below, each with its reason. Also: an argument a
class declares is enforced by ``validate`` and when a config builds it, with the key and the fix named, and a key
has one home."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import get_object
from omegaconf import OmegaConf

from specbench.configs import conf_dir, group_options
from specbench.errors import SpecbenchError
from specbench.pipelines.keys import SECTIONS, check, every_key
from specbench.pipelines.methods import make_selector
from specbench.pipelines.session.tables import SHARED
from specbench.policy.model import TrainConfig
from specbench.selection import TARGETS, UCB
from specbench.validate import SCHEMA, declared, integer, schema, tables, typed
from tests.experiments import commands_for, experiments

ROOTS = [
    "eval",
    "collect",
    "train_policy",
    "train_drafter",
    "cascades",
    "bench",
    "profile",
    "trace",
    "replay",
]
# groups whose options are composed alone, and where each lands (a drafter option lands in a pool); experiments are
# composed with their commands, and a scale is no command's: `specbench reproduce --scale` reads it (plan.load_scales,
# checked against Scale's declared fields: test_a_bad_scale_file_is_refused_by_name)
GROUPS = {
    p.name: "pool.drafters.x" if p.name == "drafter" else p.name
    for p in sorted(Path(conf_dir()).iterdir())
    if p.is_dir() and p.name not in ("experiment", "hydra", "scale")
}

# Keys that are not user settings typed here, each with its reason.
EXEMPT = {
    "selector._target_": "Hydra's instantiate target: the selector class (a bad one fails to import, by name)",
    "pool.drafters.*._target_": "Hydra's instantiate target: the drafter builder (build_pool requires it)",
    "selector_overrides.*": "merged into each selector of methods=; the keys are the selector's, whose "
    "constructor takes or refuses each one",
}

CONFIGS = (
    [(root, ()) for root in ROOTS]
    + [(command, (f"experiment={name}",)) for name in experiments() for command in commands_for(name)]
    + [
        (None, (f"+{group}@{at}={option}",))
        for group, at in GROUPS.items()
        for option in group_options(group)
    ]
)


def _id(case) -> str:
    root, overrides = case
    return "+".join([root or "", *overrides]).strip("+")


@functools.cache
def composed(root: str | None, overrides: tuple[str, ...]):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name=root, overrides=list(overrides))


def leaves(node, prefix: str = ""):
    """The dotted keys of a config's values (a list, a scalar, an empty or null mapping), unresolved."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix


def matches(key: str, pattern: str) -> bool:
    parts, want = key.split("."), pattern.split(".")
    return len(parts) == len(want) and all(w in ("*", p) for p, w in zip(parts, want))


def untyped(root, overrides) -> list[str]:
    cfg = composed(root, overrides)
    # typed by its own command's section, or another's (an experiment written for eval and collect holds collect.*)
    covered = {key for c in (root, *SECTIONS) for key, _ in typed(cfg, every_key(c), locate=get_object)}
    keys = leaves(OmegaConf.to_container(cfg, resolve=False))
    return [k for k in keys if k not in covered and not any(matches(k, p) for p in EXEMPT)]


@pytest.mark.parametrize("case", CONFIGS, ids=_id)
def test_every_yaml_key_has_a_typed_home(case):
    missing = untyped(*case)
    assert not missing, (
        f"{_id(case)}: no rule types {', '.join(missing)}: annotate the argument in the signature of the "
        "class its _target_ names (Annotated[type, rule]), add a field to the dataclass of its section beside the "
        "module that reads it (mounted in pipelines/session/tables.py or pipelines/keys.py), or to validate.SCHEMA "
        "if no class reads it"
    )


def test_each_exemption_is_still_needed():
    keys = {k for case in CONFIGS for k in leaves(OmegaConf.to_container(composed(*case), resolve=False))}
    stale = [p for p in EXEMPT if not any(matches(k, p) for k in keys)]
    assert not stale, f"exemptions no config uses any more: {stale}"
    typed_patterns = [p for p in EXEMPT if any(p in every_key(root) for root in ROOTS)]
    assert not typed_patterns, f"exempt and typed at once: {typed_patterns}"


def test_each_key_has_one_home():
    """A pattern in one table only, and no table types a key that a selector class or drafter builder declares."""
    assert sum(len(keys) for keys in tables(SHARED)) + len(SCHEMA) == len(every_key())
    for command, sections in SECTIONS.items():
        assert len(every_key(command)) == len(every_key()) + sum(len(keys) for keys in tables(sections))
    builders = {OmegaConf.load(p).get("_target_") for p in Path(conf_dir(), "drafter").glob("*.yaml")} - {
        None
    }
    for target in [*TARGETS, *builders]:
        prefix = "selector" if target in TARGETS else "pool.drafters.*"
        twice = [k for k in declared(get_object(target)) if f"{prefix}.{k}" in every_key()]
        assert not twice, f"{target} declares {twice}, which a table types too"


def test_a_key_typed_twice_is_refused():
    with pytest.raises(RuntimeError, match="seed is typed twice"):
        schema({"seed": integer(0)})  # already validate.SCHEMA's


class Horizon(UCB):
    """A new selector with a knob of its own: declared once, in its signature."""

    def __init__(self, arms, horizon: Annotated[int, integer(1, note=" (rounds)")] = 10, **kwargs):
        super().__init__(arms, **kwargs)
        self.horizon = horizon


def test_an_argument_a_class_declares_is_enforced():
    """A new selector knob is checked as soon as its signature declares it: no second list to update, in the
    composed config and when a config builds the class (a selector of methods=, outside the validated config)."""
    cfg = composed("eval", ("selector=ucb", f"selector._target_={__name__}.Horizon", "+selector.horizon=0"))
    with pytest.raises(SpecbenchError) as err:
        check(cfg)
    assert "selector.horizon=0: expected an integer >= 1 (rounds)" in err.value.problem
    assert "selector.horizon=<an integer >= 1>" in err.value.fix
    with pytest.raises(SpecbenchError, match=r"selector.horizon=0: expected an integer >= 1 \(rounds\)"):
        make_selector({"_target_": f"{__name__}.Horizon", "horizon": 0}, ["a", "b"])
    with pytest.raises(SpecbenchError, match="selector.beta=-1: expected a finite number >= 0"):
        make_selector({"_target_": f"{__name__}.Horizon", "beta": -1}, ["a", "b"])  # its base's, inherited
    assert make_selector({"_target_": f"{__name__}.Horizon", "horizon": 5}, ["a", "b"]).horizon == 5


@pytest.mark.parametrize(
    "overrides, problem, fix",
    [
        # Hedge's learning rate: missing from the old single table, so only its constructor checked it
        (
            ("selector=hedge", "selector.eta=0"),
            "selector.eta=0: expected a finite number > 0",
            "selector.eta=<a finite",
        ),
        (
            ("selector=tree_ucb", "selector.size=1.5"),
            "selector.size=1.5: expected an integer >= 1",
            "selector.size=<",
        ),
        (
            ("selector=router", "selector.min_match=0"),
            "selector.min_match=0: expected an integer >= 1",
            "selector.min_match=<an integer >= 1>",
        ),
        (
            ("selector=router", "selector.ucb.beta=-1"),
            "selector.ucb.beta=-1: expected a finite number >= 0",
            "selector.ucb.beta=<",
        ),
        (
            ("pool.drafters.prompt_lookup.draft_length=0",),
            "pool.drafters.prompt_lookup.draft_length=0: expected an integer >= 1 or null (null: decoding.draft_length)",
            "pool.drafters.prompt_lookup.draft_length=<an integer >= 1 or null>",
        ),
        (
            ("pool.drafters.prompt_lookup.cost=-1",),
            "pool.drafters.prompt_lookup.cost=-1: expected a finite number >= 0 or measured or null",
            "pool.drafters.prompt_lookup.cost=<",
        ),
        (
            ("pool.drafters.prompt_lookup.max_ngram=0",),
            "pool.drafters.prompt_lookup.max_ngram=0: expected an integer >= 1",
            "pool.drafters.prompt_lookup.max_ngram=<an integer >= 1>",
        ),
        (
            ("target.context_keys=[1]",),
            "target.context_keys=[1]: expected a list, each a non-empty string",
            "target.context_keys=<",
        ),
        (
            ("dataset.sources.math.task=3",),
            "dataset.sources.math.task=3: expected a non-empty string or null",
            "dataset.sources.math.task=<a non-empty string or null>",
        ),
        (
            ("+dataset.sources.math.task_from_category=yes",),
            "dataset.sources.math.task_from_category=yes: expected true or false",
            "dataset.sources.math.task_from_category=<true or false>",
        ),
    ],
)
def test_newly_typed_keys_refuse_bad_values_by_name(overrides, problem, fix):
    with pytest.raises(SpecbenchError) as err:
        check(composed("eval", overrides))
    assert problem in err.value.problem
    assert fix in err.value.fix and err.value.fix.endswith("(on the command line or in the config)")


def test_newly_typed_keys_of_other_commands():
    with pytest.raises(
        SpecbenchError, match=r"profile.trees=\[\[2\]\]: expected a list of \[branches, depth\]"
    ):
        check(composed("profile", ("profile.trees=[[2]]",)), "profile")
    with pytest.raises(SpecbenchError, match="eval_sets.math.limit=0: expected an integer >= 1 or null"):
        check(composed("train_drafter", ("eval_sets.math.limit=0",)), "train_drafter")
    cost = composed("eval", ("pool.drafters.prompt_lookup.cost=measured",))
    check(cost)  # a name the cost rule takes besides numbers


def test_validate_imports_no_table_until_it_runs():
    """The door imports validate before anything loads: the tables (torch, transformers) come at the first check."""
    code = "import sys, specbench.validate; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_key_two_commands_share_means_what_each_command_declares():
    """train.* is two sections: train-policy's is TrainConfig's fields, train-drafter's its own table. epochs 0 and
    lr null mean something to train-drafter (the drafter as it starts; the kind's default lr), nothing to a policy."""
    for overrides in (("train.epochs=0",), ("train.lr=null",)):
        check(composed("train_drafter", overrides), "train_drafter")
        with pytest.raises(SpecbenchError, match=overrides[0].split("=")[0]):
            check(composed("train_policy", overrides), "train_policy")
    with pytest.raises(SpecbenchError, match=r"train.epochs=0: expected an integer >= 1"):
        TrainConfig(epochs=0).check()  # the dataclass's own check reads the same declaration
    with pytest.raises(SpecbenchError, match=r"train.dropout=1: expected a finite number in \[0, 1\)"):
        TrainConfig(dropout=1).check()


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "layout: cpu\noverrides: {eval: 3}\n",
            "scale.overrides.eval=3: expected a list, each a non-empty string",
        ),
        ("layout: cpu\ndrafters: {early_exit_8: {layers: [1]}}\n", "scale.drafters.early_exit_8.layers=[1]"),
        ("overrides: {}\n", "it names no layout"),
    ],
)
def test_a_bad_scale_file_is_refused_by_name(tmp_path, text, words):
    from specbench.reproduction.plan import load_scales

    (tmp_path / "mine.yaml").write_text(text)
    with pytest.raises(SpecbenchError, match="mine.yaml") as err:
        load_scales(tmp_path)
    assert words in err.value.problem


def test_the_shipped_scales_load():
    from specbench.reproduction.plan import load_scales

    scales = load_scales()
    assert set(scales) == {"cpu", "paper", "tiny"}
    assert scales["tiny"].drafters["early_exit_16"] == {"layers": 2}
    # issue 43: the cascades' runs sit outside the CPU plan's time (make cascades-cpu); the dry run keeps every step
    assert scales["cpu"].apart == ("cascades",) and scales["tiny"].apart == () == scales["paper"].apart


def test_a_paper_kept_apart_runs_only_when_named(tmp_path, monkeypatch):
    """Issue 43: `make reproduce-cpu` keeps to its time by leaving the papers its scale keeps apart (cascades) to their
    own target, `--paper cascades`, which runs them into the same root; a scale keeping apart a paper its plan does not
    have is refused naming its file."""
    from specbench.reproduction import plan

    root = tmp_path / "root"
    _, steps, chosen = plan.choose_steps(root, "cpu", None, [], plan.QUESTIONS)
    assert {s.paper for s in steps} == {"huang", "metasd", "cascades"}
    assert {s.paper for s in chosen} == {"huang", "metasd"}
    _, _, named = plan.choose_steps(root, "cpu", ["cascades"], [], plan.QUESTIONS)
    assert {s.run for s in named} == {"cascades/greedy", "cascades/summarization", "cascades/sampling"}
    _, _, every = plan.choose_steps(root, "tiny", None, [], plan.QUESTIONS)
    assert tuple(every) == steps  # tiny keeps nothing apart: the dry run covers the cascades too
    monkeypatch.setitem(plan.SCALES, "odd", plan.Scale("cpu", apart=("leviathan",)))
    with pytest.raises(SpecbenchError, match="keeps apart unknown paper") as err:
        plan.choose_steps(root, "odd", None, [], plan.QUESTIONS)
    assert "conf/scale/odd.yaml" in err.value.fix and "cascades" in err.value.fix
