"""Provenance: every run directory records the code commit (and whether it was dirty), the packages and the
machine; the report names the commits its runs came from, says so when they are mixed, and refuses with
--one-commit; a second run of the plan marks every verdict that flips unstable, never counted held."""

from __future__ import annotations

import re
import subprocess

import pandas as pd
import pytest

from specbench import provenance
from specbench.errors import SpecbenchError
from specbench.records import PROVENANCE
from specbench.reproduction import render, stability
from specbench.reproduction import verdicts as V
from specbench.reproduction.exhibit import Exhibit
from tests.unit.test_reproduction import _huang_fixture


def _repo(path):
    path.mkdir()
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    run = lambda *a: subprocess.run(["git", "-C", str(path), *a], check=True, capture_output=True, env=env)  # noqa: E731
    run("init", "-q")
    (path / "a.py").write_text("x = 1\n")
    run("add", "a.py")
    run("commit", "-q", "-m", "one")
    return run


def test_code_state_reads_the_commit_and_the_dirty_flag(tmp_path):
    run = _repo(tmp_path / "repo")
    head = subprocess.run(
        ["git", "-C", str(tmp_path / "repo"), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert provenance.code_state(tmp_path / "repo") == {"commit": head, "dirty": False}
    (tmp_path / "repo" / "a.py").write_text("x = 2\n")  # an uncommitted change
    assert provenance.code_state(tmp_path / "repo") == {"commit": head, "dirty": True}
    run("commit", "-q", "-am", "two")
    state = provenance.code_state(tmp_path / "repo")
    assert state["commit"] != head and state["dirty"] is False
    # issue 71: a run made inside the checkout (its claim file and config written before its provenance) does not
    # mark its own commit dirty; an untracked source file outside a run directory does
    probe = tmp_path / "repo" / "probe" / "x"
    (probe / ".hydra").mkdir(parents=True)
    for name in (".specbench.yaml", "config.yaml", ".hydra/overrides.yaml", "examples.jsonl"):
        (probe / name).write_text("x: 1\n")
    (tmp_path / "repo" / "notes.md").write_text("data, not code\n")
    assert provenance.code_state(tmp_path / "repo")["dirty"] is False
    (tmp_path / "repo" / "page.md").write_text("a page\n")  # a tracked page a make target rewrites: not code
    run("add", "page.md")
    run("commit", "-q", "-m", "page")
    (tmp_path / "repo" / "page.md").write_text("the page regenerated\n")
    assert provenance.code_state(tmp_path / "repo")["dirty"] is False
    (tmp_path / "repo" / "new_module.py").write_text("y = 1\n")
    assert provenance.code_state(tmp_path / "repo")["dirty"] is True
    outside = tmp_path / "plain"
    outside.mkdir()
    assert provenance.code_state(outside) == {"commit": None, "dirty": None}


def test_record_appends_an_entry_per_code_version_and_keeps_one_for_a_rerun(tmp_path):
    base = {
        "commit": "a" * 40,
        "dirty": False,
        "packages": {"torch": "2.13.0"},
        "machine": {},
        "recorded": "t1",
    }
    provenance.record(tmp_path, base)
    provenance.record(tmp_path, {**base, "recorded": "t2"})  # the same code resumed: still one entry
    assert [e["recorded"] for e in provenance.read(tmp_path)] == ["t2"]
    provenance.record(tmp_path, {**base, "commit": "b" * 40, "recorded": "t3"})  # resumed at another commit
    assert [e["commit"][0] for e in provenance.read(tmp_path)] == ["a", "b"]
    entry = provenance.collect()
    assert {"commit", "dirty", "packages", "machine"} <= set(entry)
    assert entry["packages"]["torch"] and entry["machine"]["cores"] >= 1
    (tmp_path / PROVENANCE).write_text("{torn")
    with pytest.raises(SpecbenchError, match="damaged"):
        provenance.read(tmp_path)


def test_a_run_records_the_commit_it_ran(tmp_path):
    """``specbench eval`` (through start_run, the door every pipeline passes) writes provenance.json with this
    checkout's commit, the packages and the machine."""
    from omegaconf import OmegaConf

    from specbench.pipelines.session.run_dir import start_run

    cfg = OmegaConf.create({"threads": None})
    out = start_run(cfg, tmp_path / "run", sections={})
    (entry,) = provenance.read(out)
    assert entry["commit"] == provenance.code_state()["commit"]
    assert entry["commit"] is None or len(entry["commit"]) == 40
    assert entry["packages"]["specbench"] and entry["machine"]["torch_threads"] >= 1


def test_the_report_names_its_commits_and_says_when_they_are_mixed(tmp_path):
    root = tmp_path / "reproduce"
    _huang_fixture(root)
    (root / "huang" / "eval" / "config.yaml").write_text("threads: null\n")
    entry = {"commit": "c" * 40, "dirty": False, "packages": {}, "machine": {}}
    provenance.record(root / "huang" / "eval", entry)
    text = (render.write(root) / "REPORT.md").read_text()
    assert f"Code: every run (1) came from commit `{'c' * 10}`" in text and "Mixed code" not in text
    other = root / "huang" / "other"
    other.mkdir()
    (other / "config.yaml").write_text("threads: null\n")
    provenance.record(other, {**entry, "commit": "d" * 40, "dirty": True})
    text = (render.write(root) / "REPORT.md").read_text()
    assert "**Mixed code**: these runs came from 2 code versions" in text
    assert f"`{'d' * 10} (uncommitted changes)`: 1 runs (`huang/other`)" in text
    with pytest.raises(SpecbenchError, match="did not all come from one clean commit"):
        render.write(root, one_commit=True)


def _verdict(claim, effect, lo, hi, threshold=1.0):
    held = V.side_of(lo, hi, threshold, at_least=False)
    return V.Verdict(
        claim,
        held,
        "",
        n=32,
        effect=effect,
        interval=(lo, hi),
        label="ratio",
        threshold=threshold,
        p=0.01,
        reason="" if held is not None else V.INCONCLUSIVE,
    )


def _exhibit(verdicts):
    return Exhibit(title="x", table=pd.DataFrame(), verdicts=list(verdicts), key="metasd/x")


def test_a_verdict_that_flips_between_two_runs_is_unstable_and_not_counted_held():
    here = [
        _exhibit(
            [
                _verdict("a beats b", 1.10, 1.02, 1.18),
                _verdict("c beats d", 1.05, 1.01, 1.09),
                _verdict("e beats f", 0.9, 0.85, 0.95),
            ]
        )
    ]
    there = [
        _exhibit(
            [
                _verdict("a beats b", 1.04, 0.98, 1.10),
                _verdict("c beats d", 1.06, 1.02, 1.10),
                _verdict("e beats f", 0.92, 0.87, 0.97),
            ]
        )
    ]
    assert [v.mark for v in here[0].verdicts] == ["held", "held", "not held"]
    found = stability.mark_unstable(here, there, "run2")
    marks = [v.mark for v in here[0].verdicts]
    assert marks == ["unstable", "held", "not held"]
    flipped = here[0].verdicts[0]
    assert (
        flipped.held is None
        and "held in this run" in flipped.line()
        and "inconclusive in run2" in flipped.line()
    )
    assert flipped.line().startswith("**unstable**: a beats b (n=32")
    page = stability.page(found, "run1", "run2")
    assert (
        "3 claims judged in both runs: 2 read the same (1 held in both), 1 flipped (held / inconclusive)"
        in page
    )
    # counted as unstable in the report's counts, not held
    line = render.counts_line(here)
    assert line.startswith("3 verdicts: 1 held, 1 not held, 0 inconclusive, 0 not judged, 1 unstable")


def test_a_claim_judged_on_other_data_in_the_second_run_is_listed_not_marked():
    """A claim judged on as many queries in both runs is a rerun (its flip is unstable); one whose n differs was
    judged on other data in one run (a run outside the plan under one root only): listed, never marked."""
    from dataclasses import replace

    here = [_exhibit([_verdict("a beats b", 1.10, 1.02, 1.18), _verdict("c beats d", 1.10, 1.02, 1.18)])]
    there = [
        _exhibit(
            [
                _verdict("a beats b", 1.04, 0.98, 1.10),
                replace(_verdict("c beats d", 1.04, 0.98, 1.10), n=5),
            ]
        )
    ]
    found = stability.mark_unstable(here, there, "run2")
    assert [v.mark for v in here[0].verdicts] == ["unstable", "held"]
    page = stability.page(found, "run1", "run2")
    assert "1 claims judged in both runs: 0 read the same (0 held in both), 1 flipped" in page
    assert "1 judged on other data in each run (n differs: not compared)" in page and "other data" in page


def test_report_against_a_second_root_writes_the_stability_page(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _huang_fixture(a)
    _huang_fixture(
        b, policy_on_summarization=1.5
    )  # the policy's summarization cell falls below the best drafter
    held_alone = (render.write(a) / "REPORT.md").read_text()
    assert "**held**: the policy reaches at least" in held_alone
    out = render.write(a, tmp_path / "report", against=b)
    text = (out / "REPORT.md").read_text()
    assert "**unstable**: the policy reaches at least" in text
    assert "**held**: the policy reaches at least" not in text
    page = (out / stability.STABILITY).read_text()
    assert re.search(r"\| no +\|", page) and "1 flipped (unstable / not held)" not in page
    # the part flips; its statement is not judged in either run (its premise, the specialists' headroom, is not
    # measured without the collection's rows), so it cannot flip
    assert "1 flipped (held / not held)" in page and "[STABILITY.md](STABILITY.md)" in text
    assert "Timed claims (on the clock): 1 of " in page
    # the seed statements of the plan are counted, those whose runs are not there yet included (issue 71: the
    # family's count does not shrink with its data): more than the 7 the built exhibits give parts to
    counted = re.search(r"2 of the seeds' (\d+) statements hold", text)
    assert counted and int(counted.group(1)) > 7
    assert "not run yet" in text


def test_a_second_root_that_is_the_first_a_copy_damaged_or_of_another_scale_is_refused(tmp_path):
    """Issue 71: ``report --against`` compares two runs of one plan, so it refuses the first root itself, a
    byte-for-byte copy of it, a damaged reproduce.json and a root of another scale, each naming the fix; and the
    stability page names the second root's code."""
    import json
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    _huang_fixture(a)
    (a / "reproduce.json").write_text(json.dumps({"scale": "cpu", "layout": "cpu"}))
    with pytest.raises(SpecbenchError, match="is the report's own root"):
        render.write(a, tmp_path / "r", against=a)
    shutil.copytree(a, b)
    with pytest.raises(SpecbenchError, match="holds the same records"):
        render.write(a, tmp_path / "r", against=b)
    (b / "reproduce.json").write_text("{not json")
    with pytest.raises(SpecbenchError, match="damaged"):
        render.write(a, tmp_path / "r", against=b)
    (b / "reproduce.json").write_text(json.dumps({"scale": "tiny", "layout": "cpu"}))
    with pytest.raises(SpecbenchError, match="another scale"):
        render.write(a, tmp_path / "r", against=b)
    (b / "reproduce.json").unlink()
    with pytest.raises(SpecbenchError, match="holds no reproduce.json"):
        render.write(a, tmp_path / "r", against=b)
