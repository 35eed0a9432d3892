"""Summary rows are pure functions of example records: speedup, MAT, exact match, the oracle."""

import math

from specbench.pipelines.tables import oracle_arms, summarize


def ex(qid, task, method, seconds, ids=(1, 2, 3), calls=3, drafted=0, accepted=0, t_select=0.0):
    return {
        "query_id": qid,
        "task": task,
        "method": method,
        "output_ids": list(ids),
        "new_tokens": len(ids),
        "seconds": seconds,
        "target_calls": calls,
        "drafted": drafted,
        "accepted": accepted,
        "switches": 0,
        "t_select": t_select,
        "quality": {},
        "text": "",
        "reference": None,
    }


RECORDS = [
    ex("a", "math", "autoregressive", 4.0),
    ex("b", "chat", "autoregressive", 2.0),
    ex("a", "math", "fixed:x", 2.0, calls=1, drafted=4, accepted=2),
    ex("b", "chat", "fixed:x", 4.0, ids=(1, 2, 9)),
    ex("a", "math", "fixed:y", 8.0),
    ex("b", "chat", "fixed:y", 1.0),
    ex("a", "math", "ucb", 3.0, t_select=0.03),
    ex("b", "chat", "ucb", 1.0, t_select=0.01),
]


def test_speedup_mat_exact_match():
    s = summarize(RECORDS).set_index(["task", "method"])
    assert s.loc[("all", "fixed:x"), "speedup"] == 6.0 / 6.0
    assert s.loc[("math", "fixed:x"), "speedup"] == 2.0
    assert s.loc[("math", "fixed:x"), "mat"] == 3.0
    assert s.loc[("math", "fixed:x"), "acceptance_rate"] == 0.5
    assert s.loc[("all", "fixed:x"), "exact_match"] == 0.5
    assert s.loc[("all", "fixed:x"), "speedup_mean"] == (2.0 + 0.5) / 2
    assert math.isnan(s.loc[("all", "autoregressive"), "acceptance_rate"])
    assert abs(s.loc[("all", "ucb"), "selector_share"] - 0.01) < 1e-12


def test_oracle_is_best_fixed_drafter_per_task():
    import pandas as pd

    assert oracle_arms(pd.DataFrame(RECORDS)) == {"math": "fixed:x", "chat": "fixed:y"}
    s = summarize(RECORDS).set_index(["task", "method"])
    assert s.loc[("all", "oracle"), "seconds"] == 3.0
    assert s.loc[("all", "oracle"), "speedup"] == 2.0


def test_task_by_method_matrix():
    from specbench.pipelines.tables import pivot

    m = pivot(summarize(RECORDS), "speedup").set_index("task")
    assert list(m.columns) == ["autoregressive", "fixed:x", "fixed:y", "ucb"]  # no oracle, no "all" row
    assert list(m.index) == ["chat", "math"]
    assert m.loc["math", "fixed:x"] == 2.0 and m.loc["chat", "fixed:y"] == 2.0


def test_the_printed_summary_shows_the_compared_columns_and_defects_only_when_there_are_any():
    from specbench.pipelines.tables import compact

    table = summarize(RECORDS).assign(ties=0.0, defects=0.0)
    header = compact(table).splitlines()[0]
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols == [
        "task",
        "method",
        "speedup",
        "mat",
        "acceptance_rate",
        "exact_match",
        "ties",
        "tokens_per_s",
    ]
    table.loc[table.method == "fixed:x", "defects"] = 1
    assert "defects" in compact(table).splitlines()[0]
