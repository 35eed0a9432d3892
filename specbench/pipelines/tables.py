"""Summary tables: pure functions of example records, and the one function that prints them."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from specbench.arms import AUTOREGRESSIVE
from specbench.decoding import certify
from specbench.files import atomic_path, atomic_write_text
from specbench.pipelines import speed
from specbench.pipelines.forks import fork_of
from specbench.tasks import metrics

log = logging.getLogger(__name__)

BASELINE = AUTOREGRESSIVE
ORACLE = "oracle"
ALL_TASKS = "all"
COLUMNS = [
    "task",
    "method",
    "n_examples",
    "new_tokens",
    "seconds",
    "tokens_per_s",
    "tokens_per_s_mean",
    "speedup",
    "speedup_mean",
    "paired",
    "mat",
    "acceptance_rate",
    "exact_match",
    "ties",
    "defects",
    "switches",
    "selector_share",
]


def oracle_arms(df: pd.DataFrame) -> dict[str, str]:
    """Per task, the single fixed drafter with the fewest total seconds on that task's examples
    (the oracle of the tables: an upper bound measured on the same examples in the same run)."""
    fixed = df[df.method.str.startswith("fixed:")]
    if fixed.empty:
        return {}
    totals = fixed.groupby(["task", "method"]).seconds.sum().reset_index()
    best = totals.loc[totals.groupby("task").seconds.idxmin()]
    return dict(zip(best.task, best.method))


def with_oracle(df: pd.DataFrame) -> pd.DataFrame:
    """Add the oracle's examples: for each task, a copy of its best fixed drafter's examples."""
    arms = oracle_arms(df)
    if not arms:
        return df
    picked = pd.concat([df[(df.task == t) & (df.method == m)] for t, m in arms.items()])
    return pd.concat([df, picked.assign(method=ORACLE)], ignore_index=True)


def summarize(examples: Iterable[dict], baseline: str = BASELINE) -> pd.DataFrame:
    """One row per (task, method) plus one per method over all tasks (task = ``all``).

    - tokens_per_s: total new tokens / total seconds; tokens_per_s_mean: mean of per-example rates.
    - speedup: total baseline seconds / total method seconds over the examples both ran, each paired
      only with the baseline generation timed in the same process (``process``: a resumed run's two
      processes are never compared); speedup_mean: mean of the per-example ratios; paired: how many
      examples the speedups pair (fewer than n_examples after a resume: :func:`pairing_note`).
    - mat: new tokens per target forward (bonus token included; autoregressive = 1.00).
    - acceptance_rate: accepted draft tokens / drafted tokens (NaN when nothing was drafted).
    - exact_match: share of examples whose output ids equal the baseline's for the same query.
    - selector_share: the selector's own time (select calls) / total seconds.
    - the ``oracle`` rows: per task, the best single fixed drafter on those examples (``oracle_arms``).
    - quality columns (bleu, rouge1/2/L, accuracy, output_words): means of the per-example scores,
      except bleu, which is corpus BLEU.
    """
    df = pd.DataFrame(list(examples))
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    df = with_oracle(df)
    base = df[df.method == baseline].drop_duplicates("query_id", keep="last").set_index("query_id")
    quality_cols = sorted({k for q in df.get("quality", pd.Series(dtype=object)).dropna() for k in q})
    rows = []
    for task_key, sub in [*df.groupby("task"), (ALL_TASKS, df)]:
        for method, m in sub.groupby("method", sort=False):
            row = _row(m, base)
            row.update(task=task_key, method=method)
            for key in quality_cols:
                row[key] = quality(m, key)
            rows.append(row)
    out = pd.DataFrame(rows)
    order = {m: i for i, m in enumerate(dict.fromkeys([baseline, *df.method]))}  # oracle last
    out["_t"] = out.task.eq(ALL_TASKS)
    out["_m"] = out.method.map(order)
    out = out.sort_values(["_t", "task", "_m"]).drop(columns=["_t", "_m"]).reset_index(drop=True)
    return out[COLUMNS + quality_cols]


def convergence(rounds: Iterable[dict], arms: dict[str, str]) -> pd.DataFrame:
    """Share of rounds, by round index, in which each adaptive selector played its task's oracle arm (for
    tree rounds: had its draft in the tree).

    ``arms`` maps task -> oracle method (``fixed:<arm>``); fixed and autoregressive methods (and their A/A
    repeats, ``again:<method>``) are left out. Columns: method, round, share, n (rounds at that index).
    """
    df = pd.DataFrame(list(rounds))
    if df.empty or not arms:
        return pd.DataFrame(columns=["method", "round", "share", "n"])
    df = df[~df.method.str.startswith(("fixed:", "again:")) & (df.method != BASELINE) & df.task.isin(arms)]
    best = df.task.map(lambda t: arms[t].split(":", 1)[1])
    hit = df.arm == best
    if "members" in df:  # a tree round "played" its task's oracle arm when that arm's draft was in the tree
        hit = hit | pd.Series(
            [isinstance(m, list) and b in m for m, b in zip(df.members, best)], index=df.index
        )
    df = df.assign(hit=hit)
    out = df.groupby(["method", "round"]).hit.agg(["mean", "size"]).reset_index()
    return out.rename(columns={"mean": "share", "size": "n"})


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (ImportError without matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_convergence(conv: pd.DataFrame, path: Path, max_round: int = 40) -> None:
    """Line plot of ``convergence`` (one line per selector); needs matplotlib."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    for method, sub in conv[conv["round"] < max_round].groupby("method"):
        ax.plot(sub["round"], sub["share"], label=method)
    ax.set_xlabel("round index within a query")
    ax.set_ylabel("share of rounds playing the oracle's arm")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def quality(m: pd.DataFrame, key: str) -> float:
    """Mean of the per-example scores; BLEU is corpus BLEU over the examples that have a reference."""
    if key == "bleu" and "reference" in m:
        scored = m[m.reference.notna() & m.quality.map(lambda q: isinstance(q, dict) and "bleu" in q)]
        if len(scored):
            return metrics.corpus_bleu(list(scored.text), list(scored.reference))
    vals = [q.get(key) for q in m["quality"] if isinstance(q, dict) and q.get(key) is not None]
    return sum(vals) / len(vals) if vals else float("nan")


def process_of(df: pd.DataFrame) -> pd.Series:
    """Each record's timing process (``process``; records written before it was kept share one)."""
    return df["process"].fillna("").astype(str) if "process" in df else pd.Series("", index=df.index)


def timed_pairs(m: pd.DataFrame, base: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the examples of ``m``, their baseline examples) for the examples whose baseline (``base``, indexed by
    query id) was timed in the same process: speedups never pair timings of two processes."""
    if m.empty or base.empty:
        return m.iloc[:0], base.iloc[:0]
    have = base.assign(_p=process_of(base)).reset_index().drop_duplicates(["query_id", "_p"], keep="last")
    keys = set(zip(have.query_id, have._p))
    mine = m[[k in keys for k in zip(m.query_id, process_of(m))]]
    if mine.empty:
        return mine, base.iloc[:0]
    b = have.set_index(["query_id", "_p"]).loc[list(zip(mine.query_id, process_of(mine)))]
    return mine, b


def _row(m: pd.DataFrame, base: pd.DataFrame) -> dict:
    tokens, seconds = int(m.new_tokens.sum()), float(m.seconds.sum())
    timed, tb = timed_pairs(m, base)
    total, mean = speed.speedup(
        list(tb.seconds), list(timed.seconds), list(tb.new_tokens), list(timed.new_tokens)
    )
    paired = m[m.query_id.isin(base.index)]
    b = base.loc[paired.query_id]
    exact = (
        float(sum(list(o) == list(r) for o, r in zip(paired.output_ids, b.output_ids)) / len(paired))
        if len(paired)
        else float("nan")
    )
    ties, defects = _verdicts(paired, b)
    return {
        "n_examples": len(m),
        "new_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": speed.ratio(tokens, seconds),
        "tokens_per_s_mean": float((m.new_tokens / m.seconds).mean()),
        "speedup": total,
        "speedup_mean": mean,
        "paired": len(timed),
        "mat": speed.mat(tokens, int(m.target_calls.sum())),
        "acceptance_rate": speed.acceptance_rate(int(m.accepted.sum()), int(m.drafted.sum())),
        "exact_match": exact,
        "ties": ties,
        "defects": defects,
        "switches": int(m.switches.sum()),
        "selector_share": speed.ratio(float(m.t_select.sum()), seconds) if "t_select" in m else float("nan"),
    }


def _verdicts(paired: pd.DataFrame, base: pd.DataFrame) -> tuple[float, float]:
    """(ties, defects) among the paired examples' forks from the baseline; NaN when no example of the
    method can be judged (it keeps no deciders: sampling, a lossy cascade rule)."""
    if "deciders" not in paired or not paired.deciders.map(lambda d: d is not None).any():
        return NAN, NAN
    verdicts = [
        f["verdict"]
        for e, b in zip(paired.to_dict("records"), base.to_dict("records"))
        for f in [fork_of(e, b)]
        if f is not None
    ]
    return float(verdicts.count(certify.TIE)), float(verdicts.count(certify.DEFECT))


NAN = float("nan")


def pivot(table: pd.DataFrame, value: str) -> pd.DataFrame:
    """Task x method matrix of one summary column (the fixed drafters and the baseline; no ``all`` row)."""
    sub = table[(table.task != ALL_TASKS) & (table.method != ORACLE)]
    out = sub.pivot(index="task", columns="method", values=value)
    return out[[m for m in dict.fromkeys(sub.method) if m in out.columns]].reset_index()


def write_matrices(table: pd.DataFrame, out_dir: Path, values=("speedup", "mat", "acceptance_rate")) -> str:
    """``by_task.md``: one task x method matrix per column in ``values`` (every drafter on every task)."""
    parts = [f"## {v}\n\n{to_markdown(pivot(table, v))}" for v in values if v in table.columns]
    md = "\n\n".join(parts)
    atomic_write_text(Path(out_dir) / "by_task.md", md + "\n\n" + EVAL_NOTES + "\n")
    return md


def to_markdown(df: pd.DataFrame, floatfmt: str = ".3f") -> str:
    return df.to_markdown(index=False, floatfmt=floatfmt)


EVAL_NOTES = (
    "speedup = autoregressive seconds per new token / method seconds per new token, totals over the "
    "same examples (equal to the ratio of total seconds when outputs have equal lengths; speedup_mean: "
    "the mean of the per-example ratios; paired = how many examples the speedups pair: each with the "
    "baseline timed in the same process, so fewer than n_examples only after a resume); mat = new "
    "tokens per target forward (bonus token included); "
    "acceptance_rate = accepted / drafted tokens; exact_match = share of outputs identical to "
    "autoregressive; ties / defects = outputs that fork from autoregressive where rounding explains it "
    "(the two runs' logit margins sum to at most twice the dtype's tie tolerance) / where it does not "
    "(forks.csv lists each)."
)


def write_tables(
    df: pd.DataFrame, out_dir: Path, stem: str = "summary", title: str | None = None, notes: str = EVAL_NOTES
) -> str:
    """Write ``<stem>.csv`` and ``<stem>.md`` (table + notes defining the columns); return the table."""
    out_dir = Path(out_dir)
    write_csv(df, out_dir / f"{stem}.csv")
    md = to_markdown(df)
    atomic_write_text(
        out_dir / f"{stem}.md", (f"# {title}\n\n" if title else "") + md + "\n\n" + notes + "\n"
    )
    return md


def write_csv(df: pd.DataFrame, path: Path) -> None:
    """``df.to_csv`` through a temporary file and ``os.replace`` (an interrupted write leaves the old file)."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)


def pairing_note(table: pd.DataFrame) -> str:
    """A note naming the rows whose speedups pair fewer examples than they hold (their baseline was timed in
    another process: a resumed run), or "" when every example is paired."""
    if table.empty or "paired" not in table:
        return ""
    short = table[(table.method != BASELINE) & (table.paired < table.n_examples)]
    if short.empty:
        return ""
    rows = ", ".join(
        f"{t}/{m} {int(p)} of {int(n)}"
        for t, m, p, n in zip(short.task, short.method, short.paired, short.n_examples)
    )
    return (
        "\n\nResumed run: speedups pair each example only with the baseline timed in the same process, so "
        f"some rows pair fewer examples than they hold (paired of n_examples): {rows}."
    )


# The printed view: the columns a reader compares (summary.md / summary.csv keep every column)
SHOWN = [
    "task",
    "method",
    "speedup",
    "mat",
    "acceptance_rate",
    "exact_match",
    "ties",
    "defects",
    "tokens_per_s",
]
SHOWN_WHEN_NONZERO = {"defects"}  # a lossless run's printed table leaves them out (they are in summary.csv)


def compact(df: pd.DataFrame) -> str:
    """The printed view of a summary: task, method, speedup, MAT, acceptance, exactness (and ties, and defects
    when there are any) and tokens/s; a column no row defines is left out."""
    cols = [
        c
        for c in SHOWN
        if c in df.columns
        and not df[c].isna().all()
        and not (c in SHOWN_WHEN_NONZERO and not df[c].fillna(0).astype(bool).any())
    ]
    return to_markdown(df[cols])


def print_table(md: str, title: str | None = None) -> None:
    """The one place pipelines print tables."""
    if title:
        print(f"\n{title}")
    print(md, flush=True)
