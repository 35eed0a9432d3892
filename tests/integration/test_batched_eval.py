"""``specbench eval decoding.batch_size=B`` on the tiny Llama (fp32): the same outputs as at batch 1 for every query and
method, a record per query and a ``batches.jsonl`` line per batch whose seconds the records' sum to; what cannot batch
is refused before any model loads (by the command line's light check, naming the method and the fix); batch size 1
is today's eval (no batch file)."""

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


def test_a_batched_eval_gives_batch_ones_outputs(tmp_path):
    evaluate.run(config(), tmp_path / "one")
    evaluate.run(config("decoding.batch_size=3"), tmp_path / "three")
    one = {(e["query_id"], e["method"]): e["output_ids"] for e in _records(tmp_path / "one")}
    three = {(e["query_id"], e["method"]): e for e in _records(tmp_path / "three")}
    assert set(one) == set(three) and len(one) == 16  # 8 queries x 2 methods
    assert all(three[k]["output_ids"] == ids for k, ids in one.items())
    batches = _records(tmp_path / "three", "batches.jsonl")
    assert sorted((b["method"], b["batch"]) for b in batches) == sorted(
        (m, i) for m in ("autoregressive", "fixed:prompt_lookup") for i in range(3)
    )  # 8 queries: batches of 3, 3, 2
    for b in batches:
        rows = [three[(q, b["method"])] for q in b["query_ids"]]
        assert sum(r["seconds"] for r in rows) == pytest.approx(b["seconds"])
        assert b["new_tokens"] == sum(r["new_tokens"] for r in rows)
    assert not (tmp_path / "one" / "batches.jsonl").exists()


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["decoding.batch_size=2", "methods=[autoregressive,fixed:early_exit_1]"], "fixed:early_exit_1"),
        (["decoding.batch_size=2", "methods=[autoregressive,selector:ucb]"], "selector:ucb"),
        (["decoding.batch_size=2", "decoding.temperature=1.0"], "greedily only"),
        (["decoding.batch_size=2", "dataset.max_turns=2"], "one turn a query"),
    ],
)
def test_what_cannot_batch_is_refused_before_any_model_loads(overrides, words):
    with pytest.raises(SpecbenchError, match=words) as err:
        check_batched(config(*overrides))
    assert "decoding.batch_size=1" in err.value.fix or "decoding.temperature=0" in err.value.fix


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
