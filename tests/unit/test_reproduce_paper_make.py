"""`make reproduce-paper` runs every paper-scale experiment (the labelled substitute aside) and ends in
`specbench report` over their run directories; `make paper-drafters` runs every drafter recipe."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.experiments import experiments, paper_scale

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry(target: str) -> list[str]:
    res = subprocess.run(["make", "-n", "--no-print-directory", target, "SPECBENCH=specbench", "PYTHON=python"],
                         capture_output=True,
                         text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stderr
    return [line for line in res.stdout.splitlines() if line.strip()]


def test_reproduce_paper_runs_every_paper_experiment_and_ends_in_the_report():
    lines = dry("reproduce-paper")
    text = "\n".join(lines)
    wanted = [n for n in experiments() if paper_scale(n) and not n.startswith("drafter_") and not n.endswith("_qwen")]
    words = set(re.findall(r"\w+", text))
    missing = [n for n in wanted if n not in words]
    assert not missing, f"reproduce-paper does not run: {missing}"
    assert lines[-1] == "specbench report outputs/reproduce-paper"
    for name in ("huang_t5", "huang_gsm8k", "huang_early_exit"):  # collect -> policy -> eval with that policy
        assert f"policy.checkpoint=outputs/reproduce-paper/{name}/policy/policy.pt" in text


def test_paper_drafters_runs_every_recipe():
    text = "\n".join(dry("paper-drafters"))
    for name in (n for n in experiments() if n.startswith("drafter_")):
        assert name in text
