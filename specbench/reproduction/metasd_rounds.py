"""MetaSD, read off the per-round records (``rounds.jsonl``): how soon a selector plays its task's best arm
(BD against BE, UCB against EXP3 and sequential halving, full information against bandit feedback), UCB against the
static uniform mixture, and the round-to-round variance of the two rewards."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from specbench.pipelines.tables import ALL_TASKS
from specbench.records import CONVERGENCE_CSV, SUMMARY_CSV
from specbench.reproduction import intervals as CI
from specbench.reproduction import verdicts as V
from specbench.reproduction.compare import faster_on, figure, short_name
from specbench.reproduction.exhibit import PROJECT, Exhibit, ExhibitSpec, Layout
from specbench.reproduction.inputs import (
    NotRun,
    load_examples,
    load_round_values,
    load_rounds,
    run_table,
    speeds,
)
from specbench.reproduction.metasd import BANDITS, FIRST_ROUNDS, METASD_ROWS, UCB, UCB_BE, UCB_FI, UNIFORM
from specbench.reproduction.published import Published
from specbench.reproduction.runs import EXAMPLES, METASD_EVAL, ROUNDS


def round_shares(
    root: Path, run: str, methods: tuple[str, ...], first_rounds: int = FIRST_ROUNDS
) -> pd.DataFrame:
    """Per query (rows) and method (columns): the share of the query's first ``first_rounds`` rounds in which the
    method played its task's oracle arm (the fastest fixed drafter of the task in the run); NaN where a method has
    no rounds for a query. One read of the run's records."""
    from specbench.pipelines.tables import oracle_arms

    ex = load_examples(root, run, ("query_id", "task", "method", "seconds", "new_tokens"))
    arms = {t: m.split(":", 1)[1] for t, m in oracle_arms(ex).items()} if len(ex) else {}
    rounds = load_rounds(root, run, methods) if arms else pd.DataFrame()
    if rounds.empty:
        return pd.DataFrame(columns=list(methods))
    early = rounds[(rounds["round"] < first_rounds) & rounds.task.isin(arms)]
    early = early.assign(hit=(early.arm == early.task.map(arms)).astype(float))
    return early.groupby(["method", "query_id"]).hit.mean().unstack(0)


def on_common_queries(share: pd.DataFrame, methods) -> pd.DataFrame:
    """``share`` on the queries every one of ``methods`` has rounds for."""
    return share.dropna(subset=[m for m in methods if m in share]) if len(share) else share


def sooner(
    share: pd.DataFrame, run: str, claim: str, a: str, b: str, first_rounds: int = FIRST_ROUNDS, **kw
) -> V.Verdict:
    """``a`` plays its task's oracle arm in more of a query's first rounds than ``b``, paired per query
    (``share``: :func:`round_shares` of the run ``run``)."""
    names = (METASD_ROWS.get(a, a), METASD_ROWS.get(b, b))
    label = f"share difference {names[0]} - {names[1]}"
    if not {a, b} <= set(share.columns):
        return V.missing(
            claim,
            f"per-query rounds of {names[0]} and {names[1]} ({run}/{ROUNDS}) or the oracle's "
            f"arms ({run}/{EXAMPLES})",
            label,
        )
    pair = on_common_queries(share, (a, b))
    return V.greater_mean(
        claim,
        list(pair[a]),
        list(pair[b]),
        label,
        detail=f"per query: share of its first {first_rounds} rounds on its task's oracle arm",
        **kw,
    )


def metasd_convergence(
    root: Path, published: list[Published], lay: Layout, first_rounds: int = FIRST_ROUNDS
) -> Exhibit:
    conv = run_table(root, f"{METASD_EVAL.dir}/{CONVERGENCE_CSV}")
    early = conv[conv["round"] < first_rounds].groupby("method").share.mean()
    table = early.rename("share of the first rounds on the oracle's arm").reset_index()

    def plot(path: Path) -> None:
        def draw(ax):
            for m in (UCB, UCB_BE):
                sub = conv[(conv.method == m) & (conv["round"] < 40)]
                ax.plot(sub["round"], sub.share, label=METASD_ROWS.get(m, m))

        figure(
            path,
            draw,
            f"MetaSD convergence ({lay.scale}): BD vs BE",
            "round within a query",
            "share playing the oracle's arm",
            ylim=(0, 1.02),
        )

    claim = f"BD reaches the best arm sooner than BE (share on it over the first {first_rounds} rounds)"
    return Exhibit(
        "MetaSD, convergence: Block Divergence against Block Efficiency",
        table,
        [
            V.keyed(
                sooner(
                    round_shares(root, METASD_EVAL.dir, (UCB, UCB_BE), first_rounds),
                    METASD_EVAL.dir,
                    claim,
                    UCB,
                    UCB_BE,
                    first_rounds,
                ),
                "metasd/convergence#live",
            )
        ],
        "Share of rounds, by round index within a query, in which the selector played its task's oracle arm.",
        plot=plot,
    )


def metasd_bandits(
    root: Path, published: list[Published], lay: Layout, first_rounds: int = FIRST_ROUNDS
) -> Exhibit:
    """UCB-BD against EXP3, sequential halving and the static uniform mixture: speed and convergence."""
    run = METASD_EVAL.dir
    summary = run_table(root, f"{run}/{SUMMARY_CSV}")
    alls = speeds(summary).get(ALL_TASKS, {})
    shown = [m for m in (UCB, *BANDITS, UNIFORM) if m in alls]
    rounds = round_shares(root, run, tuple(shown), first_rounds)  # one read, for the table and every verdict
    share = on_common_queries(rounds, shown)
    table = pd.DataFrame(
        [
            {
                "method": METASD_ROWS.get(m, m),
                "speedup": alls[m],
                f"share of the first {first_rounds} rounds on the oracle arm": float(share[m].mean())
                if m in share
                else math.nan,
            }
            for m in shown
        ]
    )
    return Exhibit(
        "MetaSD, bandit algorithms: UCB against EXP3, sequential halving and the uniform mixture",
        table,
        bandit_verdicts(load_examples(root, run), rounds, alls, first_rounds),
        "The main table's mixed stream: every selector restarts on each query (bandit feedback: only the "
        "played drafter's reward is observed). Shares: per query, the share of its first rounds on its "
        "task's oracle arm (the fastest single drafter of the task in this run), averaged over queries.",
    )


def bandit_verdicts(ex: pd.DataFrame, rounds, alls: dict, first_rounds: int) -> list[V.Verdict]:
    """UCB-BD faster than the other bandits and sooner on the best arm (each one verdict over them, Bonferroni's
    level), and faster than the uniform mixture."""
    run = METASD_EVAL.dir
    return [
        V.keyed(v, f"metasd/bandits#{k}")
        for k, v in zip(
            ("faster", "sooner", "uniform"), _bandit_verdicts(ex, rounds, alls, first_rounds, run)
        )
    ]


def _bandit_verdicts(ex: pd.DataFrame, rounds, alls: dict, first_rounds: int, run: str) -> list[V.Verdict]:
    level = V.bonferroni(len(BANDITS))
    boot = CI.Bootstrap(level=level)
    name = lambda m: METASD_ROWS.get(m, m)  # noqa: E731
    return [
        V.all_of(
            "UCB-BD is faster than EXP3 and sequential halving",
            [
                (name(b), faster_on(ex, "", UCB, b, names=(name(UCB), name(b)), boot=boot, run=run))
                for b in BANDITS
                if b in alls
            ],
            f"each part: speedup ratio > 1, at level {level:.1%} (Bonferroni over the two)",
        ),
        V.all_of(
            f"UCB-BD reaches the best arm sooner than EXP3 and sequential halving (first {first_rounds} rounds)",
            [
                (name(b), sooner(rounds, run, "", UCB, b, first_rounds, boot=boot))
                for b in BANDITS
                if b in alls
            ],
            f"each part: share difference > 0, at level {level:.1%} (Bonferroni over the two)",
        ),
        faster_on(
            ex,
            "UCB-BD is faster than the static uniform mixture (a uniformly random drafter every round)",
            UCB,
            UNIFORM,
            names=(name(UCB), name(UNIFORM)),
            run=run,
        ),
    ]


def metasd_variance(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    """The per-round variance of the two rewards on the same rounds: BD against BE (MetaSD: BD is denser, so lower)."""
    run = METASD_EVAL.dir
    rounds = load_round_values(
        root, run, None, ("query_id", "task", "method", "round", "drafted", "be", "bd")
    )
    if rounds.empty and not (Path(root) / run / ROUNDS).exists():
        raise NotRun(f"{run}/{ROUNDS}")
    heads = {f"fixed:{d}" for d in (*lay.metasd[0].specialists, lay.metasd[0].generalist) if d}
    drafting = rounds[rounds.method.astype(str).isin(heads) & (pd.to_numeric(rounds.drafted) > 0)]
    drafting = drafting.assign(be=pd.to_numeric(drafting.be), bd=pd.to_numeric(drafting.bd))
    var = drafting.groupby(["query_id", "method"])[["be", "bd"]].var(ddof=1).dropna()
    per_query = var.groupby(
        "query_id"
    ).mean()  # each query: the mean over the fixed drafters of their variances
    by_drafter = var.groupby("method").mean().reset_index()
    by_drafter["method"] = by_drafter.method.map(short_name)
    table = by_drafter.rename(
        columns={"method": "drafter", "be": "variance of BE per round", "bd": "variance of BD per round"}
    )
    claim = "Block Divergence varies less from round to round than Block Efficiency (on the same rounds of the heads)"
    label = "variance difference BE - BD"
    verdict = (
        V.greater_mean(
            claim,
            list(per_query.be),
            list(per_query.bd),
            label,
            detail="per query: the mean over the single drafters of the variance of each reward over "
            "the query's drafting rounds (both rewards in [0, 1])",
        )
        if len(per_query)
        else V.missing(claim, f"drafting rounds of single drafters ({run}/{ROUNDS})", label)
    )
    verdict = V.keyed(verdict, "metasd/variance#heads")
    return Exhibit(
        "MetaSD, reward variance: Block Divergence against Block Efficiency",
        table,
        [verdict],
        "Every drafting round of every single drafter on the main table's stream carries both rewards "
        "(rounds.jsonl: be = accepted / N_max, bd = the mean of 1 - TV(p, q) over the drafted positions), so the "
        "two are compared on exactly the same rounds. The claim is judged over the heads (the specialists and the "
        "generalist: the seed's kind of drafter); prompt lookup, a deterministic drafter whose BD is its BE, is left "
        "out of it (a scope set at issue 56 after a report that averaged it in; the replayed part has the same "
        "scope).",
    )


def metasd_full_info(
    root: Path, published: list[Published], lay: Layout, first_rounds: int = FIRST_ROUNDS
) -> Exhibit:
    """Every head scored on every round (full information) against bandit feedback."""
    run = METASD_EVAL.dir
    summary = run_table(root, f"{run}/{SUMMARY_CSV}")
    alls = speeds(summary).get(ALL_TASKS, {})
    shown = [m for m in (UCB, UCB_FI, "hedge-bd") if m in alls]
    rounds = round_shares(root, run, tuple(shown), first_rounds)  # one read, for the table and every verdict
    share = on_common_queries(rounds, shown)
    rows = summary[(summary.task == ALL_TASKS) & summary.method.isin(shown)].set_index("method")
    table = pd.DataFrame(
        [
            {
                "method": METASD_ROWS.get(m, m),
                "speedup": alls[m],
                "MAT": float(rows.at[m, "mat"]),
                f"share of the first {first_rounds} rounds on the oracle arm": float(share[m].mean())
                if m in share
                else math.nan,
            }
            for m in shown
        ]
    )
    ex = load_examples(root, run)
    names = (METASD_ROWS[UCB_FI], METASD_ROWS[UCB])
    verdicts = [
        V.keyed(
            sooner(
                rounds,
                run,
                f"full information reaches the best arm sooner than bandit feedback (first {first_rounds} rounds)",
                UCB_FI,
                UCB,
                first_rounds,
            ),
            "metasd/full_info#sooner",
        ),
        V.keyed(
            faster_on(
                ex, "full information is faster than bandit feedback", UCB_FI, UCB, names=names, run=run
            ),
            "metasd/full_info#faster",
        ),
    ]
    return Exhibit(
        "Full information for heads (every head scored on every round) against bandit feedback",
        table,
        verdicts,
        "UCB-BD with full information: after each verification every head that was not played replays the "
        "played draft from the target's features (no target call) and its Block Divergence is observed; "
        "Hedge needs those observations too. The replays cost head forwards on every round, which the "
        "speed verdict counts.",
    )


BANDIT_ALGORITHMS = ExhibitSpec("metasd/bandits", metasd_bandits, (METASD_EVAL,))
VARIANCE = ExhibitSpec("metasd/variance", metasd_variance, (METASD_EVAL,))
CONVERGENCE = ExhibitSpec("metasd/convergence", metasd_convergence, (METASD_EVAL,))
# CPU scale only: the paper-scale black-box drafters (68M models) have no features to be scored from
FULL_INFO = ExhibitSpec(
    "metasd/full_info", metasd_full_info, (METASD_EVAL,), scales=("cpu",), family=PROJECT
)  # not a seed claim
