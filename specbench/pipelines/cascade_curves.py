"""``specbench cascades``' tables and plots, pure functions of its records (``pipelines/cascades.py`` runs the
grid): each method's agreement with the autoregressive output, its quality (the task registry's column) and its
speed (new tokens per target call, speedup); the curves per task (``curves.csv``, ``curves.md``, one
``curves_<task>.png`` each), the best point of each family within a tolerated quality loss (``best.csv``) and the
run's closing note."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from specbench.arms import AUTOREGRESSIVE
from specbench.decoding.cascade import RULES
from specbench.pipelines import speed, tables
from specbench.tasks.registry import quality_columns, quality_label

SD = "sd"
ALONE = "drafter_alone"


# quality column per task and the loss the closing note tolerates against lossless SD: the task registry's (a run's
# quality_metric chooses another column of a task's metric: quality_columns)
QUALITY = quality_columns()
COLUMNS = [
    "task",
    "method",
    "rule",
    "alpha",
    "n_examples",
    "metric",
    "quality",
    "speedup",
    "speedup_mean",
    "paired",
    "rejection_rate",
    "mat",
    "acceptance_rate",
    "deferral_rate",
    "agreement_exact",
    "agreement_tokens",
    "new_tokens",
    "seconds",
]


NOTES = (
    ". speedup = total autoregressive seconds / total method seconds on the same "
    "examples, each paired with the autoregressive run timed in the same process (speedup_mean: mean of "
    "per-example ratios; paired: how many examples that pairs). rejection_rate = draft tokens the verifier rejected "
    "/ draft tokens it judged (accepted + rejected; tokens after a rejection are not judged): the paper's "
    "cost proxy. mat = new tokens per target forward (bonus token included). acceptance_rate = accepted / "
    "drafted. deferral_rate = deferred / drafted positions (sd: 1 by definition; the sequential cascade: positions the "
    "target gave / (those + drafted positions)). agreement_exact = share of "
    "outputs equal to the autoregressive output; agreement_tokens = mean share of positions where they agree. "
    "drafter_alone: the drafter's own greedy generation (no target)."
)


def agreement(output: list[int], reference: list[int]) -> dict:
    """exact: identical ids; tokens: share of positions (over the longer length) with the same id."""
    n = max(len(output), len(reference))
    same = sum(a == b for a, b in zip(output, reference))
    return {"exact": list(output) == list(reference), "tokens": same / n if n else 1.0}


def notes(quality: dict[str, tuple[str, float]]) -> str:
    """The curves table's notes, naming each task's quality column."""
    return (
        "One row per (task, method). quality: "
        + ", ".join(f"{quality_label(t, col)} ({t})" for t, (col, _) in quality.items())
        + NOTES
    )


def parse_method(method: str) -> tuple[str, float]:
    """``chow@0.3`` -> (chow, 0.3); ``sd`` -> (none, 0); autoregressive / drafter_alone -> (method, nan)."""
    if method == SD:
        return "none", 0.0
    if "@" in method:
        rule, alpha = method.split("@", 1)
        return rule, float(alpha)
    return method, float("nan")


def curves(
    examples: Iterable[dict], rounds: Iterable[dict], quality: dict[str, tuple[str, float]] = QUALITY
) -> pd.DataFrame:
    """One row per (task, method): quality (the column ``quality`` names for the task), speedup over
    autoregressive, rejection rate, MAT, agreement with the autoregressive output of the same query."""
    df = pd.DataFrame(list(examples))
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    rj = pd.DataFrame(list(rounds))
    if rj.empty:
        rej = {}
    else:
        rej = {key: speed.rejections(g.to_dict("records")) for key, g in rj.groupby(["query_id", "method"])}
    df["rejected"] = [rej.get((q, m), 0) for q, m in zip(df.query_id, df.method)]
    if "deferred" not in df:
        df["deferred"] = 0
    base = df[df.method == AUTOREGRESSIVE].drop_duplicates("query_id", keep="last").set_index("query_id")
    rows = [
        curve_row(task, method, m, base, quality.get(task, (None, 0.0))[0])
        for task, sub in df.groupby("task")
        for method, m in sub.groupby("method", sort=False)
    ]
    out = pd.DataFrame(rows, columns=COLUMNS)
    first = {AUTOREGRESSIVE: 0, ALONE: 1, SD: 2}
    out["_o"] = out.method.map(lambda x: first.get(x, 3))
    out["_r"] = out.rule.map(lambda r: RULES.index(r) if r in RULES else -1)
    return out.sort_values(["task", "_o", "_r", "alpha"]).drop(columns=["_o", "_r"]).reset_index(drop=True)


def curve_row(task: str, method: str, m: pd.DataFrame, base: pd.DataFrame, key: str | None) -> dict:
    """One (task, method) row of ``curves``: ``m`` its generations, ``base`` the autoregressive ones by query,
    ``key`` the quality column (None: the task has none)."""
    rule, alpha = parse_method(method)
    paired = m[m.query_id.isin(base.index)]
    b = base.loc[paired.query_id]
    timed, tb = tables.timed_pairs(m, base)
    total, mean = speed.speedup(list(tb.seconds), list(timed.seconds))
    agree = [agreement(o, r) for o, r in zip(paired.output_ids, b.output_ids)]
    return {
        "task": task,
        "method": method,
        "rule": rule,
        "alpha": alpha,
        "n_examples": len(m),
        "metric": key or "",
        "quality": tables.quality(m, key) if key else float("nan"),
        "speedup": total,
        "speedup_mean": mean,
        "paired": len(timed),
        "rejection_rate": speed.rejection_rate(int(m.rejected.sum()), int(m.accepted.sum())),
        "mat": speed.mat(int(m.new_tokens.sum()), int(m.target_calls.sum()))
        if method != ALONE
        else float("nan"),
        "acceptance_rate": speed.acceptance_rate(int(m.accepted.sum()), int(m.drafted.sum())),
        # the sequential cascade counts the positions the target gave: a share of its output positions
        "deferral_rate": (
            speed.ratio(int(m.deferred.sum()), int(m.deferred.sum() + m.drafted.sum()))
            if rule == "sequential"
            else speed.ratio(int(m.deferred.sum()), int(m.drafted.sum()))
        ),
        "agreement_exact": sum(bool(a["exact"]) for a in agree) / len(agree) if agree else float("nan"),
        "agreement_tokens": sum(a["tokens"] for a in agree) / len(agree) if agree else float("nan"),
        "new_tokens": int(m.new_tokens.sum()),
        "seconds": float(m.seconds.sum()),
    }


def best_at_loss(table: pd.DataFrame) -> pd.DataFrame:
    """Per task and rule, the fastest alpha whose quality is within the task's tolerance of lossless SD
    (1 BLEU / ROUGE point, 0.01 accuracy); then the best rule per task first.

    Columns: task, rule, alpha, quality, sd_quality, speedup, sd_speedup, gain (speedup / sd_speedup).
    A task without speedups (a run stopped before that task's autoregressive generations: NaN) is
    skipped (:func:`unjudged_tasks`; the closing note names it), as is a rule with no speedup yet.
    """
    rows = []
    skipped = set(unjudged_tasks(table))
    for task, sub in table.groupby("task"):
        if task not in QUALITY or (sub.method == SD).sum() == 0 or task in skipped:
            continue
        tol = QUALITY[task][1]
        sd = sub[sub.method == SD].iloc[0]
        cands = sub[
            sub.method.str.contains("@") & (sub.quality >= sd.quality - tol - 1e-9) & sub.speedup.notna()
        ]
        for rule, r in cands.groupby("rule"):
            top = r.loc[r.speedup.idxmax()]
            rows.append(
                {
                    "task": task,
                    "rule": rule,
                    "alpha": top.alpha,
                    "quality": top.quality,
                    "sd_quality": sd.quality,
                    "speedup": top.speedup,
                    "sd_speedup": sd.speedup,
                    "gain": top.speedup / sd.speedup,
                }
            )
    cols = ["task", "rule", "alpha", "quality", "sd_quality", "speedup", "sd_speedup", "gain"]
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["task", "speedup"], ascending=[True, False]).reset_index(drop=True)


def unjudged_tasks(table: pd.DataFrame) -> list[str]:
    """Tasks with a quality metric whose lossless SD row has no speedup (no autoregressive generation of
    that task finished yet: a run stopped early), so no rule can be judged on them."""
    if table.empty:
        return []
    sd = table[(table.method == SD) & table.task.isin(list(QUALITY))]
    no_base = set(table.task) - set(table[table.method == AUTOREGRESSIVE].task)
    return sorted({t for t in sd[sd.speedup.isna()].task} | (no_base & set(QUALITY) & set(table.task)))


def closing_note(best: pd.DataFrame, table: pd.DataFrame | None = None) -> str:
    """One line per task: the best rule's speedup at a quality loss within tolerance of lossless SD; with
    ``table``, a line naming the tasks that could not be judged and why: no autoregressive generation of the task
    finished yet, or (a resumed run) its autoregressive runs were timed in another process than its SD runs, and
    speedups pair only within one process."""
    skipped = unjudged_tasks(table) if table is not None else []
    have_base = (
        set(table[table.method == AUTOREGRESSIVE].task) if table is not None and not table.empty else set()
    )
    unpaired, none = [t for t in skipped if t in have_base], [t for t in skipped if t not in have_base]
    tail = "".join(
        [
            f"\n- not judged (no autoregressive generation of the task finished, so no speedup): {', '.join(none)}."
            if none
            else "",
            f"\n- not judged (its autoregressive runs finished in another process than its SD runs, a resumed run, and "
            f"speedups pair only within one process): {', '.join(unpaired)}; rerun into a new directory for a speedup."
            if unpaired
            else "",
        ]
    )
    if best.empty:
        return (
            "No rule stayed within the quality tolerance of lossless SD (or no task has a quality metric)."
            + tail
        )
    lines = []
    for task, sub in best.groupby("task", sort=False):
        b = sub.iloc[0]
        tol = QUALITY[task][1]
        metric = table[table.task == task].metric.iloc[0] if table is not None else QUALITY[task][0]
        loss = f"{tol:g} point" if metric != "accuracy" else f"{tol * 100:g}% accuracy"
        lines.append(
            f"- {task}: best rule {b.rule} (alpha {b.alpha:g}): speedup {b.speedup:.3f}x over "
            f"autoregressive vs {b.sd_speedup:.3f}x for lossless SD ({b.gain:.3f}x SD's), {metric} "
            f"{b.quality:.2f} vs SD {b.sd_quality:.2f} (tolerance: {loss})."
        )
    return "\n".join(lines) + tail


def plot(table: pd.DataFrame, path: Path, title: str = "") -> None:
    """Quality against speedup for one task: each rule a line over alpha, SD and the drafter alone marked."""
    plt = tables.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sd = table[table.method == SD]
    for rule, sub in table[table.method.str.contains("@")].groupby("rule", sort=False):
        sub = pd.concat([sd, sub]).sort_values("alpha")  # every curve starts at lossless SD
        ax.plot(sub.speedup, sub.quality, marker="o", ms=4, label=rule)
    for method, marker, label in [
        (SD, "*", "SD (alpha = 0, lossless)"),
        (ALONE, "X", "drafter alone"),
        (AUTOREGRESSIVE, "s", "autoregressive"),
    ]:
        pt = table[table.method == method]
        if len(pt):
            ax.scatter(pt.speedup, pt.quality, marker=marker, s=140, color="black", zorder=5, label=label)
    metric = table.metric.iloc[0] if len(table) else ""
    ax.set_xlabel("speedup over autoregressive (total seconds)")
    ax.set_ylabel(metric or "quality")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
