"""Issue 45, mechanism 7: fix lines that are tested. For each family of errors in docs/bad-input.md that a config
or a name raises, the test provokes the error, takes the fix line's own suggestion (its KEY=VALUE, its first listed
option, its corrected command), applies it and checks that the same check now passes; and no fix line offers the
setting already in force. In process, no model loaded: the checks are the ones the command line runs before any
model loads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from specbench.configs import check_experiment_command, conf_dir, hydra_error
from specbench.errors import SpecbenchError, plain_name
from specbench.pipelines.keys import check as validate

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
OVERRIDE = re.compile(r"(\+?[A-Za-z_][\w.]*=(?:'[^']*'|\"[^\"]*\"|<[^>]*>|[^\s,;()`]+))")


def composed(*overrides: str, name: str = "eval"):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def raised(check, *args) -> SpecbenchError:
    """The SpecbenchError ``check(*args)`` raises (Hydra's own errors as the command line words them)."""
    try:
        check(*args)
    except SpecbenchError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - Hydra's composition errors, mapped as the CLI maps them
        return hydra_error(exc, "eval")
    raise AssertionError(f"{check.__name__}{args} raised nothing")


def suggested(fix: str, fill: dict[str, str] | None = None) -> list[str]:
    """The KEY=VALUE overrides a fix line suggests, each ``<placeholder>`` replaced by ``fill[key]``."""
    out = []
    for token in OVERRIDE.findall(fix):
        key, _, value = token.partition("=")
        if value.startswith("<"):
            assert fill and key.lstrip("+") in fill, (
                f"fix {fix!r} leaves {key} to fill and the test has no value"
            )
            value = fill[key.lstrip("+")]
        out.append(f"{key}={value}")
    return out


def validated(*overrides: str) -> None:
    validate(composed(*overrides))


@pytest.mark.parametrize(
    "bad, fill",
    [
        (["decoding.draft_length=abc"], {"decoding.draft_length": "4"}),
        (["decoding.temperature=-1"], {"decoding.temperature": "0"}),
        (["seed=abc", "threads=0"], {"seed": "1", "threads": "1"}),
        (["decoding.top_p=2", "dataset.limit=0"], {"decoding.top_p": "0.9", "dataset.limit": "2"}),
        (["dataset=spec_bench"], {"dataset.path": str(DATA / "mt_bench" / "question.jsonl")}),
    ],
)
def test_a_typed_values_fix_line_names_the_key_and_its_value_passes(bad, fill):
    exc = raised(validated, *bad)
    fixes = suggested(exc.fix, fill)
    assert fixes and all(f.split("=")[0] in exc.problem for f in fixes)
    kept = [b for b in bad if b.split("=")[0] not in {f.split("=")[0] for f in fixes}]
    validated(*kept, *fixes)


def test_an_unknown_group_options_fix_lists_options_that_compose():
    exc = raised(composed, "target=nope")
    options = exc.fix.removeprefix("use one of: ").split(", ")
    assert "smollm2_135m" in options
    for option in options:
        composed(f"target={option}")


def test_an_unknown_keys_fix_adds_it_on_purpose():
    exc = raised(composed, "decoding.nope=1")
    assert "prefix it with +" in exc.fix
    composed("+decoding.nope=1")


def test_an_unreadable_overrides_fix_quotes_it():
    """A value with letters outside ASCII does not parse unquoted; the fix line's quoting does."""
    exc = raised(composed, "run_name=köpf_ü")
    assert "letters outside ASCII" in exc.fix
    quoted = re.search(r"\"(\w+='[^']*')\"", exc.fix).group(1)  # the fix's own example, e.g. name='köpf'
    key, _, value = quoted.partition("=")
    assert composed(f"run_name={value}").run_name == value.strip("'")


def test_an_experiment_of_another_commands_fix_names_the_command_it_serves():
    exc = raised(check_experiment_command, "cascades_cpu", "eval")
    command = re.search(r"`specbench ([\w-]+) experiment=cascades_cpu", exc.fix).group(1)
    check_experiment_command("cascades_cpu", command.replace("-", "_"))


def test_a_name_that_would_leave_its_root_gets_a_plain_name_that_passes():
    exc = raised(
        plain_name, "../../escape_head", "name", "name the drafter with one plain name (e.g. name=my_head)"
    )
    (fix,) = suggested(exc.fix)
    assert plain_name(fix.split("=")[1], "name", "") == "my_head"


def test_a_methods_fix_lists_drafters_of_the_pool():
    """A typo in a fixed arm or a tree member is answered before any model loads; each suggested drafter parses."""
    from specbench.pipelines.evaluate import check_methods_early

    cfg = composed("methods=[autoregressive,fixed:prompt_lookpu]")
    exc = raised(check_methods_early, cfg)
    names = [n for n in cfg.pool.drafters if n in exc.fix or n in exc.problem]
    assert names, (exc.problem, exc.fix)
    check_methods_early(composed(f"methods=[autoregressive,fixed:{names[0]}]"))


def test_no_fix_line_offers_the_setting_already_in_force():
    """Each typed-value error, raised with the other keys at their defaults, never suggests the value given."""
    for bad in ("decoding.draft_length=0", "decoding.top_p=2", "dataset.limit=0"):
        exc = raised(validated, bad)
        assert bad not in exc.fix, (bad, exc.fix)


@pytest.mark.parametrize("method", ["goodput:nope", "fixed:prompt_lookp", "tree:prompt_lookp+suffix"])
def test_at_batch_a_drafter_not_in_the_pool_is_named_as_missing_with_the_nearest(method):
    """Issue 71: at decoding.batch_size above 1, a drafter the pool lacks was called "of a kind that does not draft
    per row of a batch yet"; it is named as missing, with the pool's drafters and the nearest name, and the fix's
    suggestion passes the batch check."""
    from specbench.pipelines.batch_settings import check_batched

    cfg = composed("pool=smollm2_budget", "decoding.batch_size=2", f"methods=[autoregressive,{method}]")
    exc = raised(check_batched, cfg)
    assert "no drafter" in exc.problem and "not draft per row" not in exc.problem
    assert all(name in exc.problem for name in cfg.pool.drafters)
    if "lookp" in method:
        assert "did you mean 'prompt_lookup'?" in exc.fix
        check_batched(composed("pool=smollm2_budget", "decoding.batch_size=2",
                               f"methods=[autoregressive,{method.replace('prompt_lookp', 'prompt_lookup')}]"))  # fmt: skip
