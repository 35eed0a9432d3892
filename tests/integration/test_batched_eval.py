"""``specbench eval decoding.batch_size=B`` on the tiny Llama (fp32): the same outputs as at batch 1 for every query and
method, a record per query and a ``batches.jsonl`` line per batch whose seconds the records' sum to; what cannot batch
is refused before any model loads (by the command line's light check, naming the method and the fix), and so are the
batch-only methods at batch size 1; batch size 1 is today's eval (no batch file); the batch budget and Hugging Face's
batched generate give the same outputs."""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir
from typer.testing import CliRunner

from specbench.cli import app
from specbench.configs import conf_dir
from specbench.errors import SpecbenchError
from specbench.pipelines import evaluate
from specbench.pipelines.batch_settings import check_batched

TINY = [
    "target=tiny_llama",
    "pool=tiny",
    "dataset.limit=2",
    "~dataset.sources.code",
    "decoding.max_new_tokens=12",
    "warmup.max_new_tokens=2",
    "methods=[autoregressive,fixed:prompt_lookup]",
]


def config(*overrides):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name="eval", overrides=[*TINY, *overrides])


def _records(run, name="examples.jsonl"):
    return [json.loads(x) for x in (run / name).read_text().splitlines()]


@pytest.mark.parametrize(
    "wave, waves", [(None, 1), (3, 3)]
)  # 8 queries: one wave (3 in flight, refilled), or static batches of 3, 3, 2
def test_a_batched_eval_gives_batch_ones_outputs(tmp_path, wave, waves):
    evaluate.run(config(), tmp_path / "one")
    evaluate.run(config("decoding.batch_size=3", f"decoding.batch_wave={wave or 'null'}"), tmp_path / "three")
    one = {(e["query_id"], e["method"]): e["output_ids"] for e in _records(tmp_path / "one")}
    three = {(e["query_id"], e["method"]): e for e in _records(tmp_path / "three")}
    assert set(one) == set(three) and len(one) == 16  # 8 queries x 2 methods
    assert all(three[k]["output_ids"] == ids for k, ids in one.items())
    batches = _records(tmp_path / "three", "batches.jsonl")
    assert sorted((b["method"], b["batch"]) for b in batches) == sorted(
        (m, i) for m in ("autoregressive", "fixed:prompt_lookup") for i in range(waves)
    )
    assert all(b["rows"] == 3 for b in batches)
    for b in batches:
        rows = [three[(q, b["method"])] for q in b["query_ids"]]
        assert sum(r["seconds"] for r in rows) == pytest.approx(b["seconds"])
        assert b["new_tokens"] == sum(r["new_tokens"] for r in rows)
    assert not (tmp_path / "one" / "batches.jsonl").exists()


def test_the_batch_budget_and_hf_generate_give_batch_ones_outputs(tmp_path):
    """``goodput:prompt_lookup`` (the batch budget, its forward costs measured at start-up and cached), the early
    exit at batch (a model drafter drafting its rows in one forward) whole and with the budget, and ``hf:generate``
    (Hugging Face's batched greedy decoding on the same left-padded batch) at batch 3: every query's output is batch
    1's autoregressive output."""
    import os
    from pathlib import Path

    evaluate.run(config(), tmp_path / "one")
    evaluate.run(
        config(
            "decoding.batch_size=3",
            "methods=[autoregressive,goodput:prompt_lookup,fixed:early_exit_1,goodput:early_exit_1,hf:generate]",
        ),
        tmp_path / "three",
    )
    one = {
        e["query_id"]: e["output_ids"] for e in _records(tmp_path / "one") if e["method"] == "autoregressive"
    }
    three = _records(tmp_path / "three")
    assert {e["method"] for e in three} == {
        "autoregressive",
        "goodput:prompt_lookup",
        "fixed:early_exit_1",
        "goodput:early_exit_1",
        "hf:generate",
    }
    assert len(three) == 40 and all(e["output_ids"] == one[e["query_id"]] for e in three)
    rounds = [
        r for r in _records(tmp_path / "three", "rounds.jsonl") if r["method"] == "goodput:prompt_lookup"
    ]
    assert rounds and all(r["expected"] is not None and r["predicted_s"] > 0 for r in rounds)
    assert list(
        (Path(os.environ["SPECBENCH_CACHE"]) / "profiles").glob("batch-*.json")
    )  # measured once, cached


@pytest.mark.parametrize(
    "method, played",
    [
        ("selector:ucb", {"prompt_lookup", "suffix", "early_exit_1"}),
        ("selector:router", {"prompt_lookup", "suffix", "early_exit_1"}),
        ("tree:prompt_lookup+early_exit_1", {"tree:prompt_lookup+early_exit_1"}),
    ],
)
def test_each_row_of_a_batch_runs_its_own_bandit(tmp_path, method, played):
    """``selector:ucb`` (the router: prompt lookup's draft when it matched, else a UCB's fallback; a token tree of
    prompt lookup's and the early exit's drafts) at batch 3 over a pool that batches (prompt lookup, the retrieval
    drafter and the early exit, a model drafter whose rows draft together): every query's output is batch 1's
    autoregressive output, and the rows played every drafter."""
    retrieval = ["~pool.drafters.quantized", "+drafter@pool.drafters.suffix=suffix"]
    evaluate.run(config(*retrieval), tmp_path / "one")
    evaluate.run(
        config(*retrieval, "decoding.batch_size=3", f"methods=[autoregressive,{method}]"),
        tmp_path / "three",
    )
    one = {
        e["query_id"]: e["output_ids"] for e in _records(tmp_path / "one") if e["method"] == "autoregressive"
    }
    three = _records(tmp_path / "three")
    (ucb,) = {e["method"] for e in three} - {"autoregressive"}
    assert ucb.startswith(method.removeprefix("selector:")) and len(three) == 16
    assert all(e["output_ids"] == one[e["query_id"]] for e in three)
    arms = {r["arm"] for r in _records(tmp_path / "three", "rounds.jsonl") if r["method"] == ucb}
    assert arms == played


def test_a_wave_smaller_than_the_batch_is_refused_before_any_model_loads():
    with pytest.raises(
        SpecbenchError, match="decoding.batch_wave=2 is smaller than decoding.batch_size=3"
    ) as err:
        check_batched(config("decoding.batch_size=3", "decoding.batch_wave=2"))
    assert "at least 3" in err.value.fix


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["decoding.batch_size=2", "methods=[autoregressive,fixed:quantized]"], "fixed:quantized"),
        (["decoding.batch_size=2", "methods=[autoregressive,goodput:quantized]"], "goodput:quantized"),
        (
            [
                "decoding.batch_size=2",
                "pool.drafters.early_exit_1.tree={width:2,nodes:4}",
                "methods=[autoregressive,fixed:early_exit_1]",
            ],
            "does not draft per row",
        ),
        (["methods=[autoregressive,goodput:prompt_lookup]"], "runs only in batches"),
        (["methods=[autoregressive,hf:generate]"], "runs only in batches"),
        (["decoding.batch_size=2", "methods=[autoregressive,selector:ucb]"], "may play drafter 'quantized'"),
        (["decoding.batch_size=2", "methods=[autoregressive,selector:ucb_carry]"], "carry_over"),
        (["decoding.batch_size=2", "methods=[autoregressive,selector:budget]"], "a plan"),
        (
            ["decoding.batch_size=2", "methods=[autoregressive,tree:prompt_lookup+quantized]"],
            "its tree has drafter",
        ),
        (
            ["decoding.batch_size=2", "decoding.temperature=1.0", "methods=[autoregressive,hf:generate]"],
            "hf:generate",
        ),
        (["decoding.batch_size=2", "dataset.max_turns=2"], "one turn a query"),
    ],
)
def test_what_cannot_batch_is_refused_before_any_model_loads(overrides, words):
    with pytest.raises(SpecbenchError, match=words) as err:
        check_batched(config(*overrides))
    assert any(
        fix in err.value.fix for fix in ("decoding.batch_size=1", "decoding.temperature=0", "batch_size=<2")
    )


QUIET = ["hydra/job_logging=none", "hydra/hydra_logging=none"]  # Hydra's logging would close pytest's capture


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["eval", *TINY, "decoding.batch_size=2", "methods=[autoregressive,fixed:quantized]"],
            "fixed:quantized",
        ),
        (["collect", "target=tiny_llama", "pool=tiny", "decoding.batch_size=4"], "only `specbench eval`"),
        (["eval", *TINY, "decoding.batch_size=0"], "decoding.batch_size=0: expected an integer >= 1"),
    ],
)
def test_the_command_line_refuses_a_batch_where_it_cannot_run(tmp_path, monkeypatch, args, words):
    import specbench.pipelines.session.prompting as prompting

    def load_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the batch size was checked")

    monkeypatch.setattr(prompting, "load_model", load_model)
    monkeypatch.chdir(tmp_path)
    got = CliRunner().invoke(app, [*args, *QUIET])
    assert got.exit_code == 2, got.stderr[-2000:]
    assert words in got.stderr and "fix:" in got.stderr and "Traceback" not in got.stderr


def test_a_batch_larger_than_the_queries_is_refused(tmp_path):
    with pytest.raises(SpecbenchError, match="larger than the 8 queries"):
        evaluate.run(config("decoding.batch_size=9"), tmp_path / "run")
