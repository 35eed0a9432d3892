"""MetaSD (multi-drafter speculative decoding as a bandit): the main table (single drafters, baselines and
bandits), the specialists' acceptance and MAT, switching costs (the UCB penalty and explore-then-commit), the
non-stationary stream and the multilingual runs."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from specbench.arms import AUTOREGRESSIVE
from specbench.pipelines.tables import ALL_TASKS, ORACLE
from specbench.records import SUMMARY_CSV
from specbench.reproduction import intervals as CI
from specbench.reproduction import verdicts as V
from specbench.reproduction.compare import (
    faster_on,
    fastest_on_own_task,
    fixed_methods,
    margin_over_mean,
    mat_on,
    paired,
    short_name,
    timed,
    with_published,
)
from specbench.reproduction.exhibit import PROJECT, Exhibit, ExhibitSpec, Layout, MetaRun
from specbench.reproduction.inputs import drafter_speeds, load_examples, run_table, speeds
from specbench.reproduction.published import Published
from specbench.reproduction.runs import (
    EXAMPLES,
    METASD_EAGLE,
    METASD_EVAL,
    METASD_MULTILINGUAL,
    METASD_STREAM,
)

METASD_ROWS = {
    "random-query": "random drafter per query",
    "random": "uniform mixture per round",
    "exp3-bd": "EXP3",
    "halving-bd": "sequential halving",
    "hedge-bd": "Hedge (full information)",
    "ucb-be": "UCB-BE",
    "ucb-bd": "UCB-BD",
    "ucb-bd-fi": "UCB-BD, full information",
    "ucb-switch-bd": "UCB-BD with a switching cost",
    "etc-bd": "explore-then-commit",
    "ducb-bd": "D-UCB",
    "swucb-bd": "SW-UCB",
    ORACLE: "oracle (best single drafter per task)",
}
UCB, UCB_BE, UCB_FI, UCB_SWITCH, ETC, UNIFORM = (
    "ucb-bd",
    "ucb-be",
    "ucb-bd-fi",
    "ucb-switch-bd",
    "etc-bd",
    "random",
)
NON_STATIONARY = ("ducb-bd", "swucb-bd")  # discounted and sliding-window UCB
BANDITS = ("exp3-bd", "halving-bd")  # the bandit-feedback alternatives MetaSD sets UCB against


FIRST_ROUNDS = 20  # convergence: the share of a query's first rounds on its task's oracle arm


def _tasks(sp: dict, lay: Layout) -> list[str]:
    order = lay.tasks if lay.tasks is not None else [t for t in sp if t != ALL_TASKS]
    return [t for t in order if t in sp]


BEST_ROW = "best single drafter"  # the paper's row name for it (published.yaml)


def metasd_table(root: Path, published: list[Published], lay: Layout, meta: MetaRun) -> Exhibit:
    summary = run_table(root, f"{meta.run.dir}/{SUMMARY_CSV}")
    sp = speeds(summary)
    tasks = _tasks(sp, lay) + [ALL_TASKS]
    methods = [m for m in dict.fromkeys(summary.method) if m != "autoregressive"]
    label = lambda m: m.split(":", 1)[1] if m.startswith("fixed:") else METASD_ROWS.get(m, m)  # noqa: E731
    table = pd.DataFrame(
        [{"method": label(m), **{t: sp[t].get(m, math.nan) for t in tasks}} for m in methods]
    )
    ds = drafter_speeds(summary)
    best_row = {
        "method": "best single drafter",
        **{t: max(ds.get(t, {}).values(), default=math.nan) for t in tasks},
    }
    table = pd.concat([table, pd.DataFrame([best_row])], ignore_index=True)
    pub = [
        p
        for p in published
        if p.paper == "metasd" and p.exhibit == "main" and p.row in (meta.ucb_row, BEST_ROW)
    ]
    if meta.ucb_row and pub:  # the paper's UCB and best-single rows beside ours, on the columns it publishes
        cols = [t for t in tasks if any(p.column == lay.task_columns.get(t, t) for p in pub)]
        table = with_published(
            table,
            published,
            "metasd",
            "main",
            {"UCB-BD": meta.ucb_row, "best single drafter": BEST_ROW},
            cols,
            lay.task_columns,
        )
    own = {d: t for d, t in meta.specialists.items() if any(d in ds.get(task, {}) for task in sp)}
    shown = [p for p in published if p.paper == "metasd" and p.exhibit == "main"]
    notes = (
        f"Speedup over autoregressive decoding, {meta.setting} (oracle: the best single drafter per task, measured "
        "in the same run). Published (Vicuna-7B on an A100): "
        + "; ".join(f"{p.row} on {p.column} {p.value:.3f} ({p.setting.split(':')[0]})" for p in shown)
        + "."
    )
    ex = load_examples(root, meta.run.dir)
    singles = fixed_methods(ex)
    verdicts = [
        V.all_of(
            "UCB-BD is above the best single drafter on the mixed stream",
            [(f"vs {short_name(d)}", faster_on(ex, "", UCB, d)) for d in singles],
            "each part: speedup ratio UCB-BD / that drafter > 1 (above every single drafter)",
        )
        if singles
        else V.missing(
            "UCB-BD is above the best single drafter on the mixed stream",
            f"per-query records of single drafters ({meta.run.dir}/{EXAMPLES})",
            "speedup ratio",
        ),
        fastest_on_own_task(
            ex, own, "each specialist is the fastest single drafter on its own task", meta.run.dir
        ),
    ]
    if meta.generalist:
        verdicts.append(specialists_verdict(ex, own, meta))
    return Exhibit(meta.title, table, verdicts, notes)


def specialists_verdict(ex: pd.DataFrame, own: dict[str, str], meta: MetaRun) -> V.Verdict:
    """One verdict over every specialist: faster on its own task than the other specialists' mean and than the
    generalist."""
    claim = "each specialist is faster on its task than the other specialists' mean and the generalist"
    if ex.empty:
        return V.missing(claim, f"per-query records ({meta.run.dir}/{EXAMPLES})", "speedup ratio")
    parts = []
    for d, task in own.items():
        others = [f"fixed:{o}" for o in own if o != d and f"fixed:{o}" in fixed_methods(ex, task)]
        if others:
            parts.append(
                (f"{task}: vs the others' mean", margin_over_mean(ex, f"fixed:{d}", others, task, 0.0))
            )
        parts.append(
            (
                f"{task}: vs {meta.generalist}",
                faster_on(ex, "", f"fixed:{d}", f"fixed:{meta.generalist}", task),
            )
        )
    return V.all_of(claim, parts, "each part: ratio > 1")


def metasd_heads(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    """The specialists' own table: acceptance and MAT of every specialist on every task."""
    meta = lay.metasd[0]
    summary = run_table(root, f"{meta.run.dir}/{SUMMARY_CSV}")
    mat, acc = drafter_speeds(summary, "mat"), drafter_speeds(summary, "acceptance_rate")
    tasks = _tasks(mat, lay)
    pool = [*meta.specialists, *([meta.generalist] if meta.generalist else [])]
    heads = [d for d in pool if any(d in mat.get(t, {}) for t in tasks)]
    table = pd.DataFrame(
        [
            {
                "task": t,
                **{h: f"{acc[t].get(h, math.nan):.2f} / {mat[t].get(h, math.nan):.2f}" for h in heads},
            }
            for t in tasks
        ]
    )
    own = {d: t for d, t in meta.specialists.items() if d in heads}
    ex = load_examples(root, meta.run.dir)
    claim = "each specialist has the highest MAT among the specialists on its own task"
    if ex.empty:
        verdicts = [V.missing(claim, f"per-query records ({meta.run.dir}/{EXAMPLES})", "MAT ratio")]
    else:  # the specialists only: the generalist has its own line
        verdicts = [
            V.all_of(
                claim,
                [
                    (f"{task}: {d} vs {o}", mat_on(ex, f"fixed:{d}", f"fixed:{o}", task))
                    for d, task in own.items()
                    for o in own
                    if o != d and f"fixed:{o}" in fixed_methods(ex, task)
                ],
                "each part: MAT ratio specialist / other specialist > 1",
            )
        ]
        if meta.generalist and meta.generalist in heads:
            verdicts.append(
                V.all_of(
                    f"each specialist has a higher MAT than the generalist ({meta.generalist}) on its "
                    "own task",
                    [
                        (
                            f"{task}: {d} vs {meta.generalist}",
                            mat_on(ex, f"fixed:{d}", f"fixed:{meta.generalist}", task),
                        )
                        for d, task in own.items()
                    ],
                    "each part: MAT ratio specialist / generalist > 1",
                )
            )
    return Exhibit(
        "Specialist drafters: acceptance rate / MAT of every specialist on every task",
        table,
        verdicts,
        "From the MetaSD run's single-drafter rows (greedy); verdicts on the per-query MAT "
        "(new tokens / target calls) of the same queries.",
    )


def metasd_switching(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    summary = run_table(root, f"{METASD_EVAL.dir}/{SUMMARY_CSV}")
    shown = [m for m in (UCB, UCB_SWITCH, ETC) if m in set(summary.method)]
    rows = summary[(summary.task == ALL_TASKS) & summary.method.isin(shown)]
    table = rows[["method", "speedup", "switches", "mat"]].reset_index(drop=True)
    table["method"] = table.method.map(lambda m: METASD_ROWS.get(m, m))
    ex = load_examples(root, METASD_EVAL.dir)
    name = lambda m: METASD_ROWS.get(m, m)  # noqa: E731

    def fewer(claim: str, a: str, b: str) -> V.Verdict:
        """``a`` switches drafters fewer times per query than ``b``."""
        label = f"switches per query, {name(b)} - {name(a)}"
        if ex.empty or not {a, b} <= set(ex.method):
            return V.missing(
                claim, f"per-query records of {name(a)} and {name(b)} ({METASD_EVAL.dir}/{EXAMPLES})", label
            )
        p = paired(ex, [a, b])
        return V.greater_mean(
            claim, list(p[b].switches.astype(float)), list(p[a].switches.astype(float)), label
        )

    def beats(claim: str, a: str) -> V.Verdict:
        if ex.empty or not {a, UCB} <= set(ex.method):
            return V.missing(
                claim,
                f"per-query records of {name(a)} and UCB-BD ({METASD_EVAL.dir}/{EXAMPLES})",
                "speedup ratio",
            )
        p = paired(ex, [a, UCB])
        return V.faster(claim, timed(p[a]), timed(p[UCB]), (name(a), name(UCB)))

    verdicts = [
        fewer("the switching cost cuts drafter switches", UCB_SWITCH, UCB),
        beats(
            "the switching-cost variant is faster than UCB-BD when switches cost their catch-up", UCB_SWITCH
        ),
        fewer("explore-then-commit switches less than UCB-BD with the switching penalty", ETC, UCB_SWITCH),
        beats("explore-then-commit is faster than UCB-BD when switches cost their catch-up", ETC),
    ]
    return Exhibit(
        "MetaSD, switching costs: the UCB penalty and explore-then-commit",
        table,
        verdicts,
        "Whole mixed stream. switches: drafter changes between consecutive rounds, summed over queries. "
        "UCB-BD with a switching cost subtracts the cost from the index of every drafter but the current one; "
        "explore-then-commit (the paper's algorithm for switching costs) plays each drafter a few rounds, "
        "then commits to the best.",
    )


def metasd_stream(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    summary = run_table(root, f"{METASD_STREAM.dir}/{SUMMARY_CSV}")
    sp = speeds(summary)
    tasks = _tasks(sp, lay) + [ALL_TASKS]
    methods = [m for m in (UCB, *NON_STATIONARY) if m in sp.get(ALL_TASKS, {})]
    names = METASD_ROWS
    table = pd.DataFrame(
        [{"method": names[m], **{t: sp[t].get(m, math.nan) for t in tasks}} for m in methods]
    )
    ex = load_examples(root, METASD_STREAM.dir)
    claim = "D-UCB or SW-UCB is above UCB when the task changes under the selector"
    level = V.bonferroni(2)
    verdict = (
        V.any_of(
            claim,
            [
                (
                    names[m],
                    faster_on(ex, "", m, UCB, names=(names[m], names[UCB]), boot=CI.Bootstrap(level=level)),
                )
                for m in NON_STATIONARY
                if m in set(ex.method)
            ],
            f"each part: speedup ratio > 1 at level {level:.1%} (Bonferroni over the two alternatives)",
        )
        if len(ex)
        else V.missing(claim, f"per-query records ({METASD_STREAM.dir}/{EXAMPLES})", "speedup ratio")
    )
    return Exhibit(
        "MetaSD, non-stationary stream: discounted and sliding-window UCB against UCB",
        table,
        [verdict],
        f"{lay.stream_note} The selectors' statistics carry over from turn to turn (carry_over), so the "
        "best drafter changes under them at each task boundary.",
    )


def metasd_multilingual(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    """One row per source language: its own drafter, the best single drafter, UCB-BD and the oracle."""
    rows, parts = [], []
    for lang, run in METASD_MULTILINGUAL.items():
        summary = run_table(root, f"{run.dir}/{SUMMARY_CSV}")
        alls = speeds(summary).get(ALL_TASKS, {})
        single = drafter_speeds(summary).get(ALL_TASKS, {})
        best = max(single, key=single.get) if single else ""
        rows.append(
            {
                "source language": lang,
                "own drafter": single.get(lang, math.nan),
                "best single drafter": f"{best} {single.get(best, math.nan):.3f}",
                "UCB-BD": alls.get(UCB, math.nan),
                "oracle": alls.get(ORACLE, math.nan),
            }
        )
        parts.append((lang, faster_on(load_examples(root, run.dir), "", UCB, AUTOREGRESSIVE, run=run.dir)))
    verdict = V.all_of(
        "UCB-BD accelerates every source language",
        parts,
        "each part: speedup ratio UCB-BD / autoregressive > 1",
    )
    return Exhibit(
        "MetaSD, multilingual: one drafter per source language, translating into English",
        pd.DataFrame(rows),
        [verdict],
        "One run per source language (its test split); the pool holds one 68M drafter per source language.",
    )


MAIN = ExhibitSpec(
    "metasd/main",
    lambda root, pub, lay: metasd_table(root, pub, lay, lay.meta("metasd/main")),
    (METASD_EVAL,),
    ("metasd/main",),
)
WHITEBOX = ExhibitSpec(
    "metasd/whitebox",
    lambda root, pub, lay: metasd_table(root, pub, lay, lay.meta("metasd/whitebox")),
    (METASD_EAGLE,),
    ("metasd/main",),
)
HEADS = ExhibitSpec("metasd/heads", metasd_heads, (METASD_EVAL,))
SWITCHING = ExhibitSpec(
    "metasd/switching", metasd_switching, (METASD_EVAL,), family=PROJECT
)  # not a seed claim
STREAM = ExhibitSpec(METASD_STREAM.dir, metasd_stream, (METASD_STREAM,))
MULTILINGUAL = ExhibitSpec("metasd/multilingual", metasd_multilingual, tuple(METASD_MULTILINGUAL.values()))
