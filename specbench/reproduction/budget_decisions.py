"""What the cost-model budget decided, and what it got: the decision page of one eval run (issue 58).

Read from a run directory (``examples.jsonl``, ``rounds.jsonl``), nothing re-timed. Per task, for every method whose
rounds a budget built (``Round.expected`` set):
- who drafted: the share of rounds in which each drafter's draft entered the round (a tree round's ``members``, else
  its arm), and the mean verified nodes a round (``tree_size``; a chain's draft length);
- the calibration: the accepted tokens the budget expected of the verified drafts against those it got (both per
  round, the bonus token not counted), and the seconds it predicted for drafting and verification against those the
  same rounds measured;
- where the time went: drafting's share of the measured drafting and verification seconds;
- what a model drafter added beside the retrieval draft: over the rounds where both drafted, the mean accepted tokens
  a round beyond the retrieval draft's own accepted length (``member_accepted``), and the share of those rounds in
  which the model's draft went further;
- the speed: each budget method against every single drafter (``fixed:<d>``), paired per query with a 95% interval,
  and the claim "at least ``margin`` times prompt lookup" judged on it;
- issue 69's checks: predicted against measured seconds by context length (``Round.context``), the reliability table
  (realised against expected accepted tokens by decile of the round's estimate), the share of rounds the floor
  decided (``Round.decided``: a drafter alone overruling the plan, or probed), and the budget against its best single
  drafter (the fastest over the run) overall and on every task of at least ``MIN_TASK`` queries, judged at
  ``FLOOR_MARGIN`` of its speed.

    python -m specbench.reproduction.budget_decisions outputs/budget_decisions_cpu   (make budget-decisions)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.errors import SpecbenchError, exit_on
from specbench.files import atomic_write_text, existing
from specbench.pipelines.tables import to_markdown
from specbench.reproduction import compare
from specbench.reproduction import verdicts as V
from specbench.reproduction.inputs import load_examples, load_round_values

FIELDS = (
    "query_id",
    "task",
    "method",
    "round",
    "arm",
    "accepted",
    "drafted",
    "members",
    "member_accepted",
    "tree_size",
    "expected",
    "predicted_s",
    "t_draft",
    "t_verify",
    "context",
    "decided",
)
ALL = "all"
RETRIEVAL = "suffix"  # the retrieval drafter's pool name in smollm2_budget
LOOKUP = "fixed:prompt_lookup"
MARGIN = 1.10  # issue 58's goal: the best multi-drafter method at least 1.10x prompt lookup
FLOOR_MARGIN = (
    0.97  # issue 69's goal: the budget at least 0.97x its best single drafter (the interval's lower end)
)
MIN_TASK = 8  # a task is judged apart with at least this many queries


def budget_rounds(run_dir: Path) -> pd.DataFrame:
    """The rounds of every method whose rounds a budget built, one row a round, with ``drafters`` (who drafted)."""
    run_dir = Path(run_dir)
    rounds = load_round_values(run_dir.parent, run_dir.name, None, FIELDS)
    built = rounds[rounds.expected.notna()].copy() if len(rounds) else rounds
    if built.empty:
        raise SpecbenchError(
            f"{run_dir} holds no round a budget built (no rounds.jsonl record with an 'expected' value)",
            "run an eval whose methods include selector=budget (make budget-decisions), then pass its directory",
        )
    built["drafters"] = [
        list(m) if isinstance(m, list) and m else ([] if a == "autoregressive" else [str(a)])
        for m, a in zip(built.members, built.arm, strict=True)
    ]
    for col in ("accepted", "tree_size", "expected", "predicted_s", "t_draft", "t_verify"):
        built[col] = pd.to_numeric(built[col], errors="coerce").fillna(0.0)
    return built


def decisions(rounds: pd.DataFrame, retrieval: str = RETRIEVAL) -> pd.DataFrame:
    """One row per (method, task) and per method over every task (``all``): see the module's docstring."""
    rows = []
    for (method, task), g in _groups(rounds):
        n = len(g)
        drafters = sorted({d for ds in g.drafters for d in ds})
        measured = g.t_draft.sum() + g.t_verify.sum()
        row = {
            "method": method,
            "task": task,
            "rounds": n,
            **{f"drafted: {d}": sum(d in ds for ds in g.drafters) / n for d in drafters},
            "no draft": sum(not ds for ds in g.drafters) / n,
            "nodes a round": g.tree_size.mean(),
            "expected accepted": g.expected.mean(),
            "realised accepted": g.accepted.mean(),
            "realised / expected": g.accepted.sum() / g.expected.sum() if g.expected.sum() > 0 else np.nan,
            "predicted s a round": g.predicted_s.mean(),
            "measured s a round": measured / n,
            "predicted / measured": g.predicted_s.sum() / measured if measured > 0 else np.nan,
            "drafting share": g.t_draft.sum() / measured if measured > 0 else np.nan,
            **added_beside(g, retrieval),
        }
        rows.append(row)
    out = pd.DataFrame(rows)
    shares = [c for c in out.columns if c.startswith("drafted: ")]
    out[shares] = out[shares].fillna(0.0)
    front = ["method", "task", "rounds", *shares, "no draft"]
    return out[front + [c for c in out.columns if c not in front]]


def _groups(rounds: pd.DataFrame):
    for method, g in rounds.groupby("method", sort=True):
        for task, t in g.groupby("task", sort=True):
            yield (method, task), t
        yield (method, ALL), g


def added_beside(g: pd.DataFrame, retrieval: str) -> dict[str, float]:
    """Over the rounds where the retrieval drafter and a model drafter both drafted: the share of rounds they make,
    the mean accepted tokens a round beyond the retrieval draft's own, and how often another draft went further."""
    both = [
        (acc, ma)
        for acc, ds, ma in zip(g.accepted, g.drafters, g.member_accepted, strict=True)
        if retrieval in ds and len(ds) > 1 and isinstance(ma, dict) and retrieval in ma
    ]
    if not both:
        return {"both drafted": 0.0, "added beside retrieval": np.nan, "other went further": np.nan}
    return {
        "both drafted": len(both) / len(g),
        "added beside retrieval": float(np.mean([acc - ma[retrieval] for acc, ma in both])),
        "other went further": float(
            np.mean([max(v for k, v in ma.items() if k != retrieval) > ma[retrieval] for _, ma in both])
        ),
    }


def speeds(run_dir: Path, margin: float = MARGIN) -> tuple[pd.DataFrame, list[V.Verdict]]:
    """Each budget method against each single drafter: the paired speed ratio over the queries both ran, its
    interval; and each budget method against ``margin`` x prompt lookup (a verdict), when prompt lookup ran."""
    run_dir = Path(run_dir)
    ex = load_examples(run_dir.parent, run_dir.name)
    methods = sorted(set(budget_rounds(run_dir).method))
    singles = sorted(m for m in set(ex.method) if str(m).startswith("fixed:"))
    rows, verdicts = [], []
    for m in methods:
        for s in singles:
            v = compare.faster_on(ex, f"{m} is faster than {s}", m, s, threshold=1.0, at_least=True)
            rows.append(
                {
                    "method": m,
                    "against": s,
                    "queries": v.n,
                    "speed ratio": v.effect,
                    "95% interval": _ci(v),
                    "mark": v.mark,
                }
            )
        if LOOKUP in singles:
            claim = f"{m} is at least {margin:g}x prompt lookup on these held-out questions"
            verdicts.append(compare.faster_on(ex, claim, m, LOOKUP, threshold=margin, at_least=True))
    return pd.DataFrame(rows), verdicts


def by_context(rounds: pd.DataFrame) -> pd.DataFrame:
    """Predicted against measured seconds (drafting and verification) by context bin, per budget method (rounds
    that recorded their context)."""
    from specbench.selection.costs import context_bin

    g = (
        rounds[pd.to_numeric(rounds.get("context"), errors="coerce").notna()].copy()
        if "context" in rounds
        else None
    )
    if g is None or g.empty:
        return pd.DataFrame()
    g["bin"] = [context_bin(float(c)) for c in g.context]
    rows = []
    for (method, b), t in g.groupby(["method", "bin"], sort=True):
        measured = t.t_draft.sum() + t.t_verify.sum()
        low = 0 if b == 0 else 64 * 2**b
        rows.append(
            {
                "method": method,
                "context": f"{low}-{64 * 2 ** (b + 1) - 1}",
                "rounds": len(t),
                "predicted s a round": t.predicted_s.mean(),
                "measured s a round": measured / len(t),
                "predicted / measured": t.predicted_s.sum() / measured if measured > 0 else np.nan,
            }
        )
    return pd.DataFrame(rows)


def reliability(rounds: pd.DataFrame) -> pd.DataFrame:
    """Realised against expected accepted tokens by decile of the round's expected tokens, per budget method."""
    rows = []
    for method, g in rounds.groupby("method", sort=True):
        if len(g) < 10:
            continue
        decile = pd.qcut(g.expected.rank(method="first"), 10, labels=False)
        for d, t in g.groupby(decile, sort=True):
            rows.append(
                {
                    "method": method,
                    "decile": int(d) + 1,
                    "rounds": len(t),
                    "expected": t.expected.mean(),
                    "realised": t.accepted.mean(),
                    "realised / expected": t.accepted.sum() / t.expected.sum()
                    if t.expected.sum() > 0
                    else np.nan,
                }
            )
    return pd.DataFrame(rows)


def floor_shares(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per budget method and task: the share of rounds the plan decided, a probe, or the floor (a drafter alone
    that measured better than the plan in the query)."""
    if "decided" not in rounds:
        return pd.DataFrame()
    label = rounds.decided.fillna("plan").astype(str).str.split(":").str[0]
    rows = []
    for (method, task), g in _groups(rounds.assign(label=label)):
        rows.append(
            {"method": method, "task": task, "rounds": len(g)}
            | {k: float((g.label == k).mean()) for k in ("plan", "probe", "floor")}
        )
    return pd.DataFrame(rows)


def against_best(run_dir: Path, margin: float = FLOOR_MARGIN) -> list[V.Verdict]:
    """Each budget method against its best single drafter (the fastest over the run, by summed seconds over summed
    tokens), overall and per task of at least ``MIN_TASK`` queries: held when the paired interval's lower end is at
    least ``margin``."""
    run_dir = Path(run_dir)
    ex = load_examples(run_dir.parent, run_dir.name)
    singles = sorted(m for m in set(ex.method) if str(m).startswith("fixed:"))
    if not singles:
        return []
    rate = {m: ex[ex.method == m].new_tokens.sum() / ex[ex.method == m].seconds.sum() for m in singles}
    best = max(singles, key=lambda m: rate[m])
    out = []
    for m in sorted(set(budget_rounds(run_dir).method)):
        for task in [
            None,
            *sorted(t for t, g in ex[ex.method == m].groupby("task") if g.query_id.nunique() >= MIN_TASK),
        ]:
            where = f" on {task}" if task else " over every task"
            claim = f"{m} keeps at least {margin:g}x its best single drafter ({best}){where}"
            out.append(compare.faster_on(ex, claim, m, best, task, threshold=margin, at_least=True))
    return out


def _table(df: pd.DataFrame, empty: str) -> str:
    return to_markdown(df, floatfmt=".3f") if len(df) else empty


def _ci(v: V.Verdict) -> str:
    return f"[{v.interval[0]:.3f}, {v.interval[1]:.3f}]" if v.interval else "n/a"


def reading(table: pd.DataFrame) -> list[str]:
    """Per budget method over every task, the page's reading of where its time goes (from the numbers above)."""
    lines = []
    for _, r in table[table.task == ALL].iterrows():
        cal, pred, draft = r["realised / expected"], r["predicted / measured"], r["drafting share"]
        added, both = r.get("added beside retrieval", np.nan), r.get("both drafted", 0.0)
        lines.append(
            f"- `{r.method}`: it got {cal:.2f}x the accepted tokens it expected a round and its rounds took "
            f"{1 / pred:.2f}x the seconds it predicted; drafting is {draft:.0%} of the measured seconds; in the "
            f"{both:.0%} of rounds where a model drafter drafted beside the retrieval draft it added "
            + (f"{added:.2f} accepted tokens a round." if np.isfinite(added) else "nothing measurable.")
        )
    return lines


def write(run_dir: Path, margin: float = MARGIN) -> Path:
    """``budget_decisions.md`` (and ``.csv``) in ``run_dir``; its path."""
    run_dir = Path(run_dir)
    rounds = budget_rounds(run_dir)
    table = decisions(rounds)
    speed, verdicts = speeds(run_dir, margin)
    older = "This run's rounds did not record it (a run before issue 69)."
    lines = [
        f"# What the budget decided, and what it got ({run_dir.name})",
        "",
        f"Generated by `python -m specbench.reproduction.budget_decisions {run_dir}` from the run's records "
        "(nothing re-timed). Shares are of the method's rounds; accepted tokens leave the bonus token out; "
        "seconds are drafting plus verification as the round measured them (selection and switching apart).",
        "",
        "## Who drafted, the calibration, where the time went",
        "",
        to_markdown(table, floatfmt=".3f"),
        "",
        "## Reading",
        "",
        *reading(table),
        "",
        "## Speed against each single drafter (paired per query, 95% interval)",
        "",
        to_markdown(speed, floatfmt=".3f") if len(speed) else "No single drafter ran beside the budget.",
        "",
        *[f"- {v.line()}" for v in verdicts],
        "",
        "## Against the best single drafter (issue 69's floor)",
        "",
        *[f"- {v.line()}" for v in against_best(run_dir)],
        "",
        "## Who decided: the plan, a probe, the floor",
        "",
        _table(floor_shares(rounds), older),
        "",
        "## Predicted against measured seconds by context length",
        "",
        _table(by_context(rounds), older),
        "",
        "## Reliability: realised against expected accepted tokens by decile of the estimate",
        "",
        _table(reliability(rounds), "Too few rounds."),
        "",
    ]
    table.to_csv(run_dir / "budget_decisions.csv", index=False)
    path = run_dir / "budget_decisions.md"
    atomic_write_text(path, "\n".join(lines))
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m specbench.reproduction.budget_decisions RUN_DIR")
    try:
        existing(
            sys.argv[1],
            "the eval run",
            "run `make budget-decisions` first (it writes the runs), or pass the "
            "directory of an eval run that decoded with the budget",
        )
        print(write(Path(sys.argv[1])).read_text(encoding="utf-8"))
    except SpecbenchError as exc:
        exit_on(exc)
