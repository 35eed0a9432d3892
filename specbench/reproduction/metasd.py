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
    fixed_methods,
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
    METASD_SEED_LIVE,
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
    shown = [p for p in published if p.paper == "metasd" and p.exhibit == "main"]
    notes = (
        f"Speedup over autoregressive decoding, {meta.setting} (oracle: the best single drafter per task, measured "
        "in the same run). Published (Vicuna-7B; the seed names no GPU): "
        + "; ".join(f"{p.row} on {p.column} {p.value:.3f} ({p.setting.split(':')[0]})" for p in shown)
        + "."
    )
    notes += (
        " The specialists' speeds are in the table; whether each is the fastest drafter on its own task is not a "
        "claim of the seed (its claim is that a specialist's acceptance drops off its task: metasd/heads)."
    )
    return Exhibit(meta.title, table, main_verdicts(root, meta, _tasks(sp, lay)), notes)


def main_verdicts(root: Path, meta: MetaRun, tasks: list[str]) -> list[V.Verdict]:
    """UCB-BD above every single drafter of the stream, and faster than autoregressive decoding on every task."""
    ex = load_examples(root, meta.run.dir)
    singles = fixed_methods(ex)
    best = V.all_of(
        "UCB-BD is above the best single drafter on the mixed stream",
        [(f"vs {short_name(d)}", faster_on(ex, "", UCB, d)) for d in singles],
        "each part: speedup ratio UCB-BD / that drafter > 1 (above every single drafter)",
    )
    if not singles:
        best = V.missing(
            "UCB-BD is above the best single drafter on the mixed stream",
            f"per-query records of single drafters ({meta.run.dir}/{EXAMPLES})",
            "speedup ratio",
        )
    accelerates = V.all_of(
        "UCB-BD accelerates every task of the stream",
        [(t, faster_on(ex, "", UCB, AUTOREGRESSIVE, t, run=meta.run.dir)) for t in tasks],
        "each part: speedup ratio UCB-BD / autoregressive > 1",
    )
    return [V.keyed(best, f"{meta.key}#beats-best"), V.keyed(accelerates, f"{meta.key}#accelerates")]


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
    else:  # the specialists only (the seed's claim: a specialist's acceptance drops off its task)
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
    verdicts = [V.keyed(v, "metasd/heads#diagonal") for v in verdicts]
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
    return Exhibit(
        "MetaSD, switching costs: the UCB penalty and explore-then-commit",
        table,
        switching_verdicts(load_examples(root, METASD_EVAL.dir)),
        "Whole mixed stream. switches: drafter changes between consecutive rounds, summed over queries. "
        "UCB-BD with a switching cost subtracts the cost from the index of every drafter but the current one; "
        "explore-then-commit (the paper's algorithm for switching costs) plays each drafter a few rounds, "
        "then commits to the best.",
    )


def switching_verdicts(ex: pd.DataFrame) -> list[V.Verdict]:
    """The penalty and explore-then-commit against UCB-BD: switches per query and speed, paired per query."""
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

    return [
        V.keyed(
            fewer("the switching cost cuts drafter switches", UCB_SWITCH, UCB),
            "metasd/switching#penalty-fewer",
        ),
        V.keyed(
            beats(
                "the switching-cost variant is faster than UCB-BD when switches cost their catch-up",
                UCB_SWITCH,
            ),
            "metasd/switching#penalty-faster",
        ),
        V.keyed(
            fewer(
                "explore-then-commit switches less than UCB-BD with the switching penalty", ETC, UCB_SWITCH
            ),
            "metasd/switching#etc-fewer",
        ),
        V.keyed(
            beats("explore-then-commit is faster than UCB-BD when switches cost their catch-up", ETC),
            "metasd/switching#etc-faster",
        ),
    ]


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
        [V.keyed(verdict, "metasd/stream#live")],
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
    verdict = V.keyed(
        V.all_of(
            "UCB-BD accelerates every source language",
            parts,
            "each part: speedup ratio UCB-BD / autoregressive > 1",
        ),
        "metasd/multilingual#languages",
    )
    return Exhibit(
        "MetaSD, multilingual: one drafter per source language, translating into English",
        pd.DataFrame(rows),
        [verdict],
        "One run per source language (its test split); the pool holds one 68M drafter per source language.",
    )


def metasd_seed_live(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    """MetaSD on its own kind of pool, live: UCB-BD over the five task specialists (the only arms) against each of them
    alone on the task-by-task stream, with the carried variant, the small drafter and prompt lookup beside."""
    run = METASD_SEED_LIVE.dir
    summary = run_table(root, f"{run}/{SUMMARY_CSV}")
    sp = speeds(summary)
    tasks = _tasks(sp, lay) + [ALL_TASKS]
    methods = [m for m in dict.fromkeys(summary.method) if m != AUTOREGRESSIVE]
    table = pd.DataFrame(
        [{"method": short_name(m), **{t: sp[t].get(m, math.nan) for t in tasks}} for m in methods]
    )
    ex = load_examples(root, run)
    arms = [f"fixed:{d}" for d in lay.metasd[0].specialists if f"fixed:{d}" in set(ex.method)]
    verdict = V.all_of(
        "UCB-BD over the five specialists is faster than each of them alone (the seed's kind of pool, live)",
        [(f"vs {short_name(d)}", faster_on(ex, "", UCB, d, run=run)) for d in arms],
        "each part: speedup ratio UCB-BD / that specialist > 1 (above the best of them)",
    )
    if not arms:
        verdict = V.missing(verdict.claim, f"the specialists' rows ({run}/{EXAMPLES})", "speedup ratio")
    return Exhibit(
        "MetaSD on its own kind of pool, live: UCB-BD over the five task specialists",
        table,
        [V.keyed(verdict, "metasd/seed_live#beats-best")],
        "The five task heads are the bandits' only arms (they cost the same per round, like the seed's equal-size "
        "drafters); the small drafter and prompt lookup are fixed reference rows. The local data's five tasks one "
        "after another, 8 queries each, 128 new tokens, greedy, bf16 (conf/experiment/metasd_seed_cpu.yaml); "
        "ucb-bd resets per query, ucb-bd-carry keeps its statistics across the stream (shown, not judged).",
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
SEED_LIVE = ExhibitSpec("metasd/seed_live", metasd_seed_live, (METASD_SEED_LIVE,))
SWITCHING = ExhibitSpec(
    "metasd/switching", metasd_switching, (METASD_EVAL,), family=PROJECT
)  # not a seed claim
STREAM = ExhibitSpec(METASD_STREAM.dir, metasd_stream, (METASD_STREAM,))
MULTILINGUAL = ExhibitSpec("metasd/multilingual", metasd_multilingual, tuple(METASD_MULTILINGUAL.values()))
