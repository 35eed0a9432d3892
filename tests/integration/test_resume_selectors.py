"""A resumed run never silently differs from an uninterrupted one: a selector that carries statistics
across queries (``carry_over``) cannot be resumed half way, so the run refuses with a clear error."""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

from specbench.configs import conf_dir
from specbench.errors import SpecbenchError
from specbench.pipelines import evaluate

TINY = [
    "target=tiny_llama",
    "pool=tiny",
    "dataset.limit=1",
    "decoding.max_new_tokens=6",
    "warmup.max_new_tokens=0",
    "selector=ucb",
    "methods=[autoregressive,selector]",
]


def config(*overrides):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name="eval", overrides=[*TINY, *overrides])


def drop_last_example_of(run_dir, method):
    lines = (run_dir / "examples.jsonl").read_text().splitlines()
    last = max(i for i, x in enumerate(lines) if json.loads(x)["method"] == method)
    (run_dir / "examples.jsonl").write_text("".join(x + "\n" for i, x in enumerate(lines) if i != last))


def test_warm_start_selector_refuses_a_partial_resume(tmp_path):
    run_dir = tmp_path / "run"
    evaluate.run(config("selector.carry_over=true"), run_dir)
    drop_last_example_of(run_dir, "ucb-bd")
    with pytest.raises(SpecbenchError, match="carry_over"):
        evaluate.run(config("selector.carry_over=true"), run_dir)


def test_per_query_selector_resumes(tmp_path):
    run_dir = tmp_path / "run"
    evaluate.run(config(), run_dir)
    before = (run_dir / "examples.jsonl").read_text().splitlines()
    drop_last_example_of(run_dir, "ucb-bd")
    evaluate.run(config(), run_dir)
    after = (run_dir / "examples.jsonl").read_text().splitlines()
    assert len(after) == len(before)
    key = lambda x: (json.loads(x)["query_id"], json.loads(x)["method"], json.loads(x)["output_ids"])  # noqa: E731
    assert sorted(map(key, after)) == sorted(map(key, before))
