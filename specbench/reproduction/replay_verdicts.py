"""The long-horizon replays' per-query columns, verdicts and exhibit tables (``long_horizon.py`` runs the replays and
writes the page): seconds, rounds and tokens per (method, query) averaged over seeds; speed verdicts on target rounds
(MetaSD's stopping-time objective, exact in a greedy replay) or on the replay clock, each labelled replayed; the
convergence, reward-variance and regret tables; the per-query and per-task oracles."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd

from specbench.arms import AUTOREGRESSIVE
from specbench.records import CONVERGENCE_CSV, read_jsonl
from specbench.reproduction import verdicts as V
from specbench.reproduction.runs import ROUNDS

REPLAYED = "replayed"
BINS = [(0, 10), (10, 25), (25, 50), (50, 100), (100, 200), (200, 10**9)]


def per_query(seeds_jsonl: Path) -> pd.DataFrame:
    """Per (method, query): seconds and tokens averaged over seeds, best-arm shares and switches."""
    df = pd.DataFrame(list(read_jsonl(seeds_jsonl)))
    return (
        df.groupby(["method", "query_id", "task"], sort=False)
        .agg(
            seconds=("seconds", "mean"),
            new_tokens=("new_tokens", "mean"),
            rounds=("rounds", "mean"),
            switches=("switches", "mean"),
            best_share=("best_share", "mean"),
            early=("best_share_early", "mean"),
            late=("best_share_late", "mean"),
        )
        .reset_index()
    )


def query_oracle(q: pd.DataFrame) -> pd.DataFrame:
    """Per query, the fastest fixed drafter's row (the per-query oracle)."""
    fixed = q[q.method.str.startswith("fixed:")].copy()
    fixed["spt"] = fixed.seconds / fixed.new_tokens
    return fixed.loc[fixed.groupby("query_id").spt.idxmin()].set_index("query_id")


# What a replayed speed claim is judged on. MetaSD's objective is the stopping time: the fewest target rounds
# (target forwards) to emit the answer, which a greedy replay computes exactly (every method emits the same tokens
# and each round is one target call), so no clock error enters; the wall-clock ratio is printed beside it. Only
# the switching-cost claims, whose cost is time and not rounds, are judged on the clock (with its measured error).
ROUNDS_AXIS = "rounds"
CLOCK_AXIS = "seconds"


AXIS_WHAT = {ROUNDS_AXIS: "tokens per target round ratio", CLOCK_AXIS: "speedup ratio"}


def timed(q: pd.DataFrame, method: str, ids, cost: str = CLOCK_AXIS) -> tuple[list[float], list[float]]:
    """Per query of ``ids``: (``method``'s ``cost``, its new tokens); ``cost`` seconds or rounds."""
    m = q[q.method == method].set_index("query_id").reindex(ids)
    return list(m[cost]), list(m.new_tokens)


def speed_verdict(
    q: pd.DataFrame,
    claim: str,
    a: str,
    b: str | pd.DataFrame,
    threshold: float = 1.0,
    at_least: bool = False,
    names=None,
    cost: str = CLOCK_AXIS,
) -> V.Verdict:
    """``a`` faster than ``b`` (a method, or a per-query frame such as an oracle's) per query, on ``cost``: seconds
    (the replay clock) or target rounds (then the wall-clock ratio of the same pair is printed beside it)."""
    ids = sorted(set(q[q.method == a].query_id))

    def judged(axis: str) -> V.Verdict:
        other = (
            (list(b.reindex(ids)[axis]), list(b.reindex(ids).new_tokens))
            if isinstance(b, pd.DataFrame)
            else timed(q, b, ids, axis)
        )
        pair = names or (a, b if isinstance(b, str) else "oracle")
        return V.faster(claim, timed(q, a, ids, axis), other, pair, threshold, at_least, what=AXIS_WHAT[axis])

    v = judged(cost)
    if cost != CLOCK_AXIS:
        clock = judged(CLOCK_AXIS)
        v = dataclasses.replace(v, detail=f"wall-clock beside, not judged: {clock.stats}")
    return labelled(v)


def labelled(v: V.Verdict) -> V.Verdict:
    return dataclasses.replace(v, claim=f"[{REPLAYED}] {v.claim}")


def share_verdict(q: pd.DataFrame, claim: str, a: str, b: str, column: str) -> V.Verdict:
    pa = q[q.method == a].set_index("query_id")[column]
    pb = q[q.method == b].set_index("query_id")[column]
    ids = sorted(set(pa.dropna().index) & set(pb.dropna().index))
    return labelled(
        V.greater_mean(
            claim,
            list(pa.reindex(ids)),
            list(pb.reindex(ids)),
            f"difference in share of rounds on the best drafter ({a} - {b})",
        )
    )


def convergence_table(run: Path) -> pd.DataFrame:
    conv = pd.read_csv(run / CONVERGENCE_CSV)
    rows = []
    for method, sub in conv.groupby("method", sort=False):
        row = {"method": method}
        for lo, hi in BINS:
            part = sub[(sub["round"] >= lo) & (sub["round"] < hi)]
            label = f"rounds {lo}-{hi - 1}" if hi < 10**9 else f"rounds {lo}+"
            row[label] = float((part.share * part.n).sum() / part.n.sum()) if part.n.sum() else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def plot_convergence(run: Path, path: Path, methods: list[str]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    conv = pd.read_csv(run / CONVERGENCE_CSV)
    fig, ax = plt.subplots(figsize=(7, 4))
    for m in methods:
        sub = conv[(conv.method == m) & (conv.n >= 20)].sort_values("round")
        if len(sub):
            ax.plot(sub["round"], sub.share.rolling(10, min_periods=1).mean(), label=m)
    ax.set_xlabel("round index")
    ax.set_ylabel("share on the query's fastest drafter")
    ax.set_title("Convergence over traces (replayed; 10-round moving mean)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def variance_table(run: Path, among: list[str] | None = None) -> tuple[pd.DataFrame, list[V.Verdict]]:
    """Per fixed drafter: the variance of the rounds' BD and BE (seed 0: fixed arms are seedless), and per query;
    the claim is judged over ``among`` (the drafters the selectors play: a trace's reference rows are shown, not
    judged), every drafter when None."""
    rounds = pd.DataFrame(list(read_jsonl(run / ROUNDS)))
    rounds = rounds[rounds.method.str.startswith("fixed:") & (rounds.n_max > 0)]
    rows, parts = [], []
    for method, sub in rounds.groupby("method", sort=False):
        per_q = sub.groupby("query_id").agg(bd=("bd", "var"), be=("be", "var")).dropna()
        rows.append(
            {
                "drafter": method.split(":", 1)[1],
                "rounds": len(sub),
                "mean BD": sub.bd.mean(),
                "var BD": sub.bd.var(),
                "mean BE": sub.be.mean(),
                "var BE": sub.be.var(),
                "var BE / var BD": sub.be.var() / sub.bd.var() if sub.bd.var() else math.nan,
            }
        )
        part = V.greater_mean(
            f"BE rewards vary more than BD rewards within a query ({method})",
            list(per_q.be),
            list(per_q.bd),
            "mean per-query variance difference (BE - BD)",
        )
        if among is None or method.split(":", 1)[1] in among:
            parts.append((method.split(":", 1)[1], part))
    # one claim, judged once over every drafter (an intersection-union test: held only when every part holds;
    # its p-value is the largest part's), not once per drafter
    claim = "BE rewards vary more than BD rewards within a query, for every single drafter" + (
        " the selectors play" if among is not None else ""
    )
    played = rounds if among is None else rounds[rounds.method.isin([f"fixed:{a}" for a in among])]
    verdicts = [V.keyed(labelled(V.all_of(claim, parts)), "metasd/long_horizon#variance")] if parts else []
    found = discrimination(played)
    if found is not None:
        verdicts.append(V.keyed(labelled(found), "metasd/long_horizon#discrimination"))
    return pd.DataFrame(rows), verdicts


def discrimination(rounds: pd.DataFrame) -> V.Verdict | None:
    """Block Divergence tells the best drafter from the second more clearly than Block Efficiency: per query, each
    reward's gap between its best and second-best drafter (by mean reward over the query's drafting rounds) over
    the pooled standard deviation of those two drafters' rounds; BD's standardized gap above BE's, paired per query.
    None with fewer than two drafters."""
    bd, be = [], []
    for _, sub in rounds.groupby("query_id"):
        found = [_gap(sub, col) for col in ("bd", "be")]
        if None in found:
            continue
        bd.append(found[0])
        be.append(found[1])
    if not bd:
        return None
    return V.greater_mean(
        "BD separates the best drafter from the second more clearly than BE (standardized gap per query)",
        bd,
        be,
        "difference in standardized best-vs-second gap (BD - BE)",
    )


def _gap(sub: pd.DataFrame, col: str) -> float | None:
    """A query's gap between its two drafters with the highest mean ``col`` over the pooled standard deviation of
    their rounds (None: fewer than two drafters with two rounds, or no spread)."""
    stats = sub.groupby("method")[col].agg(["mean", "var", "count"])
    stats = stats[stats["count"] >= 2].sort_values("mean", ascending=False)
    if len(stats) < 2:
        return None
    a, b = stats.iloc[0], stats.iloc[1]
    pooled = math.sqrt(
        ((a["count"] - 1) * a["var"] + (b["count"] - 1) * b["var"]) / (a["count"] + b["count"] - 2)
    )
    return float((a["mean"] - b["mean"]) / pooled) if pooled > 0 else None


def regret_table(q: pd.DataFrame, among: list[str] | None = None) -> tuple[pd.DataFrame, list[V.Verdict]]:
    """Each method's speed against the oracles; the verdict: UCB-BD against the best single drafter (of ``among``,
    the bandits' arms, when given: a reference row no bandit plays is not the best single arm)."""
    oracle = query_oracle(q)
    ar = q[q.method == AUTOREGRESSIVE].set_index("query_id")
    rnd = q[q.method == "oracle:round"].set_index("query_id")
    rows = []
    for method, sub in q.groupby("method", sort=False):
        m = sub.set_index("query_id")
        spt = m.seconds / m.new_tokens
        rows.append(
            {
                "method": method,
                "queries": len(m),
                "speedup": (ar.seconds.reindex(m.index).sum() / ar.new_tokens.reindex(m.index).sum())
                / (m.seconds.sum() / m.new_tokens.sum()),
                "vs per-query oracle": (oracle.seconds / oracle.new_tokens).reindex(m.index).sum() / spt.sum()
                if len(oracle)
                else math.nan,
                "vs per-round oracle": ((rnd.seconds / rnd.new_tokens).reindex(m.index).sum() / spt.sum())
                if len(rnd)
                else math.nan,
                "best share": m.best_share.mean(),
                "switches / query": m.switches.mean(),
                "rounds / query": m.rounds.mean(),
                "tokens / round": m.new_tokens.sum() / m.rounds.sum(),  # the stopping-time axis (MAT)
            }
        )
    # UCB-BD against the per-query oracle is shown (the table's ratio), not judged: the papers give no fraction of
    # the oracle to hold (0.95 was this project's goal in issue 32), and "slower than the oracle" holds by definition.
    claim = f"UCB-BD is faster than the best single drafter over the stream, {IN_ROUNDS}"
    best = best_single(q, ROUNDS_AXIS, among)
    verdicts = [speed_verdict(q, claim, "ucb-bd", best, cost=ROUNDS_AXIS)]
    return pd.DataFrame(rows).dropna(axis=1, how="all"), verdicts


def on_the_clock(v: V.Verdict) -> bool:
    """Whether a replayed verdict is judged on the replay clock (so its measured error can undecide it); a verdict
    on target rounds or on shares is exact in a greedy replay."""
    return v.label.startswith(AXIS_WHAT[CLOCK_AXIS])


IN_ROUNDS = "in target rounds"  # the words a claim judged on the rounds axis ends with


def best_single(q: pd.DataFrame, cost: str = CLOCK_AXIS, among: list[str] | None = None) -> str:
    """The fixed drafter (of ``among``, when given) with the least ``cost`` (seconds, or target rounds) per token
    over all queries."""
    fixed = q[q.method.str.startswith("fixed:")]
    if among:
        fixed = fixed[fixed.method.isin([f"fixed:{a}" for a in among])]
    fixed = fixed.groupby("method")[[cost, "new_tokens"]].sum()
    return str((fixed[cost] / fixed.new_tokens).idxmin())


def task_oracle(q: pd.DataFrame) -> pd.DataFrame:
    """Per query, the row of its task's fastest fixed drafter over the task's queries (the per-task oracle: one arm
    per task, chosen in hindsight)."""
    fixed = q[q.method.str.startswith("fixed:")]
    totals = fixed.groupby(["task", "method"])[["seconds", "new_tokens"]].sum()
    best = (totals.seconds / totals.new_tokens).groupby(level="task").idxmin()
    chosen = {task: method for task, (_, method) in best.items()}
    return fixed[fixed.method == fixed.task.map(chosen)].set_index("query_id")


def seed_pool_cause(st: pd.DataFrame) -> str:
    """What the table measures about why UCB-BD trails the best single drafter on this pool (empty without it)."""
    rows = st.set_index("method")
    if "ucb-bd" not in rows.index:
        return ""
    ucb, single = rows.loc["ucb-bd"], rows[rows.index.str.startswith("fixed:")]
    text = (
        f" Measured cause: the {len(single)} heads run within {single.speedup.min():.3f}-{single.speedup.max():.3f}x "
        f"autoregressive, so their reward gaps are small, and ucb-bd, reset at every query, switches drafters on "
        f"{ucb['switches / query']:.0f} of its {ucb['rounds / query']:.0f} rounds a query and plays each query's "
        f"fastest drafter on {ucb['best share']:.0%} of them: it is still exploring when a query ends, paying a "
        "catch-up at nearly every round."
    )
    if "ucb-bd-carry" in rows.index:
        carry = rows.loc["ucb-bd-carry"]
        text += (
            f" Carried across the stream it switches {carry['switches / query']:.0f} times a query and runs at "
            f"{carry.speedup:.3f}x."
        )
    return text


def segment_bests(q: pd.DataFrame) -> str:
    """Per task, in stream order: the fixed drafter with the fewest seconds per token over the task's queries."""
    fixed = q[q.method.str.startswith("fixed:")]
    out = []
    for task, sub in fixed.groupby("task", sort=False):
        spt = sub.groupby("method").seconds.sum() / sub.groupby("method").new_tokens.sum()
        out.append(f"{task}: {spt.idxmin().removeprefix('fixed:')}")
    return ", ".join(out)
