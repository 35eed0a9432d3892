"""`make reproduce-paper` runs `specbench reproduce --scale paper`, whose plan holds every paper-scale
experiment (the labelled substitute aside) and ends in `specbench report` over their run directories;
`make paper-drafters` runs every drafter recipe."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.experiments import experiments, paper_scale

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry(target: str) -> list[str]:
    res = subprocess.run(
        ["make", "-n", "--no-print-directory", target, "SPECBENCH=specbench", "PYTHON=python"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return [line.rstrip() for line in res.stdout.splitlines() if line.strip()]


def test_reproduce_paper_runs_every_paper_experiment_and_ends_in_the_report():
    from specbench.reproduction import plan

    lines = dry("reproduce-paper")
    paper = plan.plan_at("paper")
    assert lines[-1] == (
        "specbench reproduce --scale paper --root outputs/reproduce-paper "
        "--questions data/spec_bench/question.jsonl"
    )
    planned = {
        o.removeprefix("experiment=") for step in paper for o in step.overrides if o.startswith("experiment=")
    }
    wanted = [
        n
        for n in experiments()
        if paper_scale(n) and not n.startswith("drafter_") and not n.endswith("_qwen")
    ]
    missing = [n for n in wanted if n not in planned]
    assert not missing, f"reproduce-paper does not run: {missing}"
    # collect -> policy -> eval with that policy, each in its fixed directory
    evals = {s.run: s for s in paper if s.command == "eval" and "selector=policy" in s.overrides}
    assert "huang/eval" in evals
    assert "policy.checkpoint={root}/huang/policy/policy.pt" in evals["huang/eval"].overrides
    policies = {s.run for s in paper if s.command == "train_policy"}
    assert all(
        o.removeprefix("data={root}/") in {x.run for x in paper if x.command == "collect"}
        for s in paper
        if s.command == "train_policy"
        for o in s.overrides
        if o.startswith("data=")
    )
    assert {"huang/policy", "huang/math/policy", "huang/depth/with_ar", "huang/depth/without_ar"} <= policies


def test_paper_drafters_runs_every_recipe():
    text = "\n".join(dry("paper-drafters"))
    for name in (n for n in experiments() if n.startswith("drafter_")):
        assert name in text
