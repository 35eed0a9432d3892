"""Paired per-query comparisons of methods (the verdicts' data): records aligned by query id within one timing
process, speed and MAT ratios judged with ``verdicts``, the published values set beside a table, one figure."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.arms import AGAIN
from specbench.pipelines.tables import ALL_TASKS, pyplot
from specbench.reproduction import intervals as CI
from specbench.reproduction import verdicts as V
from specbench.reproduction.inputs import drafter_speeds, paired
from specbench.reproduction.published import Published, lookup
from specbench.reproduction.runs import EXAMPLES


def pair_columns(a: pd.DataFrame, b: pd.DataFrame, cost: str = "seconds") -> dict[str, np.ndarray]:
    """The paired per-query columns of two methods' records aligned by query (``intervals.speed_ratio``'s: a_s, a_t,
    b_s, b_t): ``speed_ratio()`` of them is how much faster ``a`` is than ``b``. ``cost``: the record column a
    token is paid in (``seconds``: wall-clock; ``target_calls``: target forwards, so the ratio is one of tokens
    per target call)."""
    return {
        "a_s": a[cost].to_numpy(float),
        "a_t": a.new_tokens.to_numpy(float),
        "b_s": b[cost].to_numpy(float),
        "b_t": b.new_tokens.to_numpy(float),
    }


def timed(p: pd.DataFrame) -> tuple[list[float], list[float]]:
    return list(p.seconds.astype(float)), list(p.new_tokens.astype(float))


def called(p: pd.DataFrame) -> tuple[list[float], list[float]]:
    """(target forward calls, new tokens) per query: :func:`verdicts.faster` on these judges tokens per target
    call (the seeds' measure of speed where the target's forward is the cost), not the clock."""
    return list(p.target_calls.astype(float)), list(p.new_tokens.astype(float))


def faster_on(
    ex: pd.DataFrame,
    claim: str,
    a: str,
    b: str,
    task: str | None = None,
    *,
    names: tuple[str, str] | None = None,
    run: str = "",
    **kw,
) -> V.Verdict:
    """``a`` faster than ``b``, paired per query of ``task``; ``kw`` as :func:`verdicts.faster`'s (``threshold``
    and ``at_least``: at least that share of its speed; ``detail``; ``boot``)."""
    names = names or (short_name(a), short_name(b))
    if ex.empty:
        return V.missing(
            claim,
            f"per-query records ({run}/{EXAMPLES})" if run else "per-query records",
            f"speedup ratio {names[0]} / {names[1]}",
        )
    p = paired(ex, [a, b], task)
    return V.faster(claim, timed(p[a]), timed(p[b]), names, **kw)


ORACLE = "per-query oracle"


def with_oracle(ex: pd.DataFrame, arms: list[str], name: str = ORACLE) -> pd.DataFrame:
    """``ex`` with the records of a per-query oracle added (method ``name``): on each query every one of ``arms``
    ran in one process, the arm that was fastest there (least seconds per new token). Cross-fitted when every arm
    has an A/A repeat in the run (``again:<arm>``): the arm is chosen on the first runs' seconds and its record is
    the repeat's, so the oracle does not gain from the noise it chose on; otherwise chosen in hindsight from the same
    timings it reports (it gains from their noise as well)."""
    cross = cross_fitted(ex, arms)
    p = paired(ex, [*arms, *[AGAIN + a for a in arms]] if cross else arms)
    if not p or any(v.empty for v in p.values()):
        return ex
    per_token = pd.DataFrame(
        {a: p[a].seconds.astype(float) / p[a].new_tokens.astype(float).clip(lower=1) for a in arms}
    )
    best = per_token.idxmin(axis=1)
    source = (lambda a: p[AGAIN + a]) if cross else (lambda a: p[a])
    rows = (
        pd.DataFrame([source(best[q]).loc[q] for q in per_token.index]).rename_axis("query_id").reset_index()
    )
    rows["method"] = name
    return pd.concat([ex, rows[list(ex.columns)]], ignore_index=True)


def cross_fitted(ex: pd.DataFrame, arms: list[str]) -> bool:
    """Whether :func:`with_oracle` cross-fits the oracle of ``arms`` on ``ex`` (every arm has an A/A repeat)."""
    return bool(arms) and all((ex.method == AGAIN + a).any() for a in arms)


def short_name(method: str) -> str:
    return method.split(":", 1)[1] if method.startswith("fixed:") else method


def fixed_methods(ex: pd.DataFrame, task: str | None = None) -> list[str]:
    sub = ex if task in (None, ALL_TASKS) else ex[ex.task == task]
    return [m for m in dict.fromkeys(sub.method) if str(m).startswith("fixed:")]


def fastest_on_own_task(ex: pd.DataFrame, own: dict[str, str], claim: str, run: str) -> V.Verdict:
    """On each task with a specialist (``own[drafter] = task``), the specialist is faster than every other
    fixed drafter of the run, each pair judged per query."""
    if ex.empty:
        return V.missing(claim, f"per-query records ({run}/{EXAMPLES})", "speedup ratio")
    parts = [
        (f"{task}: {d} vs {short_name(o)}", faster_on(ex, "", f"fixed:{d}", o, task))
        for d, task in own.items()
        for o in fixed_methods(ex, task)
        if o != f"fixed:{d}"
    ]
    return V.all_of(claim, parts, "each part: speedup ratio specialist / other > 1")


def margin_over_mean(
    ex: pd.DataFrame, drafter: str, others: list[str], task: str, margin: float
) -> V.Verdict:
    """``drafter``'s speedup over autoregressive decoding is at least ``1 + margin`` times the mean of ``others'``
    speedups, on the queries of ``task`` all of them ran."""
    from specbench.arms import AUTOREGRESSIVE

    methods = [AUTOREGRESSIVE, drafter, *others]
    p = paired(ex, methods, task)
    cols = {}
    for i, m in enumerate(methods):
        cols[f"m{i}_s"], cols[f"m{i}_t"] = timed(p[m])

    def stat(c):
        sp = [
            CI.seconds_per_token(c["m0_s"], c["m0_t"]) / CI.seconds_per_token(c[f"m{i}_s"], c[f"m{i}_t"])
            for i in range(1, len(methods))
        ]
        return sp[0] / (sum(sp[1:]) / len(sp[1:]))

    return V.judge(
        "", cols, stat, 1 + margin, f"speedup ratio {short_name(drafter)} / mean of the others", at_least=True
    )


def mat_on(ex: pd.DataFrame, a: str, b: str, task: str) -> V.Verdict:
    """``a``'s MAT (new tokens per target call) above ``b``'s, paired per query of ``task``."""
    p = paired(ex, [a, b], task)
    cols = {
        "a_n": p[a].new_tokens,
        "a_c": p[a].target_calls,
        "b_n": p[b].new_tokens,
        "b_c": p[b].target_calls,
    }
    stat = lambda c: CI.ratio_of_sums("a_n", "a_c")(c) / CI.ratio_of_sums("b_n", "b_c")(c)  # noqa: E731
    return V.judge(
        "",
        {k: list(v.astype(float)) for k, v in cols.items()},
        stat,
        1.0,
        f"MAT ratio {short_name(a)} / {short_name(b)}",
    )


def relative_faster(
    claim: str,
    ex_a: pd.DataFrame,
    ex_b: pd.DataFrame,
    method: str,
    names: tuple[str, str],
    runs: tuple[str, str],
) -> V.Verdict:
    """``method`` of run A faster than ``method`` of run B, where A and B are separate processes: each query's
    speedup over its own run's autoregressive decoding of it (paired within its run), the ratio of the two
    speedups over the queries both runs hold, with the bootstrap over those queries."""
    from specbench.arms import AUTOREGRESSIVE

    label = f"speedup ratio {names[0]} / {names[1]} (each over its run's autoregressive)"
    if ex_a.empty or ex_b.empty:
        return V.missing(claim, f"per-query records ({runs[0] if ex_a.empty else runs[1]}/{EXAMPLES})", label)
    pa, pb = paired(ex_a, [method, AUTOREGRESSIVE]), paired(ex_b, [method, AUTOREGRESSIVE])
    common = sorted(set(pa[method].index) & set(pb[method].index), key=str)
    cols = {}
    for tag, p in (("a", pa), ("b", pb)):
        for m, short in ((method, "m"), (AUTOREGRESSIVE, "ar")):
            cols[f"{tag}{short}_s"], cols[f"{tag}{short}_t"] = timed(p[m].loc[common])

    def stat(c):
        def sp(t):
            return CI.seconds_per_token(c[f"{t}ar_s"], c[f"{t}ar_t"]) / CI.seconds_per_token(
                c[f"{t}m_s"], c[f"{t}m_t"]
            )

        return sp("a") / sp("b")

    return V.judge(claim, cols, stat, 1.0, label)


def best_fixed(summary: pd.DataFrame, task: str = ALL_TASKS) -> str | None:
    """The fixed drafter with the highest speedup of the eval ``summary`` on ``task`` (by its total), or None."""
    single = drafter_speeds(summary).get(task, {})
    return f"fixed:{max(single, key=single.get)}" if single else None


def with_published(
    table: pd.DataFrame,
    published: list[Published],
    paper: str,
    exhibit: str,
    rows: dict[str, str],
    columns: list[str],
    aliases: dict[str, str] | None = None,
) -> pd.DataFrame:
    """Add ``<column> (paper)`` beside each of ``columns``: ``rows`` maps our row label -> the paper's row,
    ``aliases`` our column -> the paper's (default: the same name)."""
    out = table.copy()
    for col in columns:
        theirs = (aliases or {}).get(col, col)
        vals = [lookup(published, paper, exhibit, rows.get(label, ""), theirs) for label in out.iloc[:, 0]]
        out.insert(list(out.columns).index(col) + 1, f"{col} (paper)", vals)
    return out


def figure(path: Path, draw: Callable, title: str, xlabel: str, ylabel: str, size=(6, 3.5), **axes) -> None:
    """One PNG: ``draw(ax)`` plots, then labels, ``axes`` (e.g. ``xscale="log"``, ``ylim=(0, 1)``) and a legend."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=size)
    draw(ax)
    ax.set(xlabel=xlabel, ylabel=ylabel, **axes)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
