"""``specbench reproduce --scale tiny``: the whole CPU reproduction plan as a dry run on the tiny
Llama (the real experiment configs, the local real data, a few tokens per query), then the report.
Every exhibit is built, and a rerun skips every finished step."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from specbench.reproduction import plan, statements
from specbench.reproduction.catalog import builders
from specbench.reproduction.layouts import CPU as CPU_LAYOUT
from tests.conftest import write_tiny_shipped

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.mark.slow  # 130 s: the slow set (make test-slow, which CI runs too)
@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is not present (a user's fresh clone)")
def test_dry_run_builds_every_exhibit_and_resumes(tmp_path, monkeypatch, tiny_llama_target, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECBENCH_CACHE", str(cache))
    monkeypatch.setenv("SPECBENCH_HEADS", str(cache / "drafters"))  # the pools' package: heads
    target = tiny_llama_target
    write_tiny_shipped(target, cache / "drafters")  # the pools' heads and small drafter
    root = tmp_path / "reproduce"
    report = plan.run(root, scale="tiny")

    text = (report / "REPORT.md").read_text()
    assert "Not run yet" not in text
    stated = len(statements.KEYS)  # the seeds' statements and the project's, one verdict each
    assert text.count("### [") == len(builders(CPU_LAYOUT)) + stated
    # every verdict of the CPU plan is a part of a listed statement, and each statement is judged once
    listed = {s.key for s in statements.STATEMENTS}
    for family_page in ("seeds", "project"):
        table = pd.read_csv(report / "statements" / f"{family_page}.csv")
        assert set(table.statement) <= listed, set(table.statement) - listed
        assert table.statement.is_unique
    for step in plan.plan_at("cpu"):
        assert (root / step.run / plan.DONE).exists(), step.run
    for name in (
        "huang/table1",
        "huang/fig2",
        "huang/fig3",
        "metasd/main",
        "metasd/convergence",
        "cascades/sampling",
    ):
        assert (report / f"{name}.md").exists() and (report / f"{name}.csv").exists(), name
    for fig in ("huang/fig2", "huang/fig3", "metasd/convergence", "cascades/greedy"):
        assert (report / f"{fig}.png").exists(), fig
    marks = re.findall(r"^- \*\*(held|not held|inconclusive|not judged)\*\*: ", text, re.M)
    assert len(marks) >= 15  # the tiny dry run has too few queries per cell to judge: mostly "not judged"
    # every step finished, so no verdict is set aside as read off a partial run
    assert "on the finished part" not in text
    # the index lists exactly the verdicts of the exhibit pages
    pages = [report / link for link in re.findall(r"^### \[[^\]]*\]\(([^)]+\.md)\)", text, re.M)]
    assert len(pages) == len(builders(CPU_LAYOUT)) + stated
    assert sum(
        len(re.findall(r"^- \*\*(?:held|not held|inconclusive|not judged)\*\*: ", p.read_text(), re.M))
        for p in pages
    ) == len(marks)

    # a rerun decodes nothing: every step is skipped and the records are untouched
    before = (root / "metasd" / "eval" / "examples.jsonl").read_text()
    capsys.readouterr()
    plan.run(root, scale="tiny")
    assert "specbench eval" not in capsys.readouterr().out
    assert (root / "metasd" / "eval" / "examples.jsonl").read_text() == before


def test_unknown_scale_or_paper_is_refused(tmp_path):
    from specbench.errors import SpecbenchError

    with pytest.raises(SpecbenchError, match="unknown reproduce scale 'gpu'"):
        plan.run(tmp_path, scale="gpu")
    with pytest.raises(SpecbenchError, match="unknown paper"):
        plan.run(tmp_path, papers=["leviathan"])
