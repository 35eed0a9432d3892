"""The budget's decision page on a seeded synthetic run: who drafted, the calibration, the time split and what a
model drafter added beside the retrieval draft are the records' own numbers; a budget 1.2x faster than prompt lookup
on every query holds "at least 1.10x" and one at 1.0x does not; a run without budget rounds is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specbench.errors import SpecbenchError
from specbench.reproduction import budget_decisions as B


def _round(q, task, method, i, members, member_accepted, accepted, expected, tree_size=6, t_draft=0.01):
    return {
        "query_id": q,
        "task": task,
        "method": method,
        "round": i,
        "arm": "tree:" + "+".join(members) if len(members) > 1 else members[0],
        "drafted": tree_size,
        "accepted": accepted,
        "members": members if len(members) > 1 else None,
        "member_accepted": member_accepted,
        "tree_size": tree_size,
        "expected": expected,
        "predicted_s": 0.03,
        "t_draft": t_draft,
        "t_verify": 0.03,
    }


def _run(tmp_path, speedup: float, queries: int = 24):
    rng = np.random.default_rng(0)
    run = tmp_path / "run"
    run.mkdir()
    rounds, examples = [], []
    for q in range(queries):
        task = "chat" if q % 2 else "math"
        qid = f"{task}-{q}"
        # half the rounds the retrieval draft alone (3 accepted), half both (the head adds 1)
        rounds.append(_round(qid, task, "selector", 0, ["suffix"], None, 3, 2.0))
        rounds.append(
            _round(qid, task, "selector", 1, ["suffix", "head"], {"suffix": 1, "head": 2}, 2, 2.0, 10, 0.02)
        )
        ar = float(rng.uniform(1.0, 2.0))
        for method, seconds in (
            ("autoregressive", ar),
            ("fixed:prompt_lookup", ar / 1.5),
            ("selector", ar / 1.5 / speedup),
        ):
            examples.append(
                {"query_id": qid, "task": task, "method": method, "seconds": seconds, "new_tokens": 64}
            )
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    (run / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in examples))
    return run


def test_the_decisions_are_the_records_own_numbers(tmp_path):
    table = B.decisions(B.budget_rounds(_run(tmp_path, 1.2)))
    every = table[(table.method == "selector") & (table.task == B.ALL)].iloc[0]
    assert every["rounds"] == 48
    assert every["drafted: suffix"] == 1.0 and every["drafted: head"] == 0.5
    assert every["realised accepted"] == pytest.approx(2.5) and every["expected accepted"] == pytest.approx(
        2.0
    )
    assert every["realised / expected"] == pytest.approx(1.25)
    assert every["predicted / measured"] == pytest.approx(0.06 / (0.01 + 0.02 + 0.06))
    assert every["drafting share"] == pytest.approx(0.03 / 0.09)
    assert every["both drafted"] == 0.5 and every["added beside retrieval"] == pytest.approx(1.0)
    assert every["other went further"] == 1.0
    assert set(table.task) == {"chat", "math", B.ALL}


@pytest.mark.parametrize("speedup, mark", [(1.2, "held"), (1.0, "not held")])
def test_the_margin_over_prompt_lookup_is_judged_paired(tmp_path, speedup, mark):
    _, verdicts = B.speeds(_run(tmp_path, speedup))
    assert len(verdicts) == 1 and verdicts[0].mark == mark
    assert verdicts[0].effect == pytest.approx(speedup)


def test_the_page_is_written_and_a_run_without_budget_rounds_is_refused(tmp_path):
    run = _run(tmp_path, 1.2)
    text = B.write(run).read_text()
    assert "added 1.00 accepted tokens a round" in text and "at least 1.1x prompt lookup" in text
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "rounds.jsonl").write_text(json.dumps({"method": "fixed:suffix", "accepted": 1}) + "\n")
    with pytest.raises(SpecbenchError, match="no round a budget built"):
        B.budget_rounds(empty)
