"""Huang et al. (context-aware drafter selection): Table 1 (each specialist on both tasks, and the policy), Fig. 2
(the alpha trade-off), Fig. 3 (speed against training queries), Table 4 (math, with the autoregressive arm) and
Table 6 (drafters at several depths, with and without the autoregressive arm)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from specbench.arms import AUTOREGRESSIVE
from specbench.pipelines.tables import ALL_TASKS
from specbench.records import ALPHA_SWEEP_CSV, DATA_EFFICIENCY_CSV, DATA_EFFICIENCY_QUERIES_CSV, SUMMARY_CSV
from specbench.reproduction import verdicts as V
from specbench.reproduction.compare import (
    best_fixed,
    faster_on,
    figure,
    relative_faster,
    short_name,
    with_published,
)
from specbench.reproduction.exhibit import Exhibit, ExhibitSpec, Layout
from specbench.reproduction.inputs import (
    NOT_PAIRED,
    arm_choices,
    choices_speed,
    choices_text,
    drafter_speeds,
    load_examples,
    n_val_of,
    optional_table,
    policy_metrics,
    read_table,
    replayed,
    run_table,
    speeds,
    validation_choices,
)
from specbench.reproduction.published import Published
from specbench.reproduction.runs import (
    HUANG_ALPHA,
    HUANG_ALPHA_SPEED,
    HUANG_DEPTH_COLLECT,
    HUANG_EVAL,
    HUANG_EVAL_WITH_AR,
    HUANG_EVAL_WITHOUT_AR,
    HUANG_MATH_COLLECT,
    HUANG_MATH_EVAL,
    HUANG_MATH_POLICY,
    HUANG_MATH_POLICY_SPEED,
    HUANG_POLICY,
    HUANG_WITH_AR,
    HUANG_WITH_AR_SPEED,
    HUANG_WITHOUT_AR,
    HUANG_WITHOUT_AR_SPEED,
    Run,
)
from specbench.tasks.registry import table1_columns

TABLE1_QUALITY = table1_columns()  # task -> Table 1's quality column, from the task registry
# The paper's own worst cell of Table 1: the policy's 1.17x against T5-small-XSum's 1.21x on XSum (1.09x against
# 1.10x on IWSLT), so "as fast as the best specialist" means at least 1.17 / 1.21 of it.
WITHIN = round(1.17 / 1.21, 3)
WITHIN_CLAIM = (
    f"the policy reaches at least {WITHIN} of the best drafter's speed on every task (the paper's worst "
    "cell: 1.17x against 1.21x on XSum, Table 1)"
)
# Table 4: drafting alone about 0.75x, the policy with the autoregressive arm about 0.95x (the paper's text).
TABLE4_POLICY = 0.95


def huang_table1(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    summary = run_table(root, f"{HUANG_EVAL.dir}/{SUMMARY_CSV}")
    notes = (
        "Speedup over autoregressive decoding on held-out rows (the policy's eval slice, disjoint from the "
        "collected queries), with each cell's acceptance rate and output quality (BLEU, ROUGE-L: greedy "
        "decoding is lossless in exact arithmetic, so a row's quality departs from the target's only where a bf16 "
        "rounding tie changed an output: the columns show by how much). Paper: T5-large target with T5-small "
        f"(a generalist that translates well) and T5-small-XSum; ours: {lay.huang_models}. Reward: "
        f"{lay.table1_reward}"
    )
    notes += choices_note(root, HUANG_EVAL.dir, speeds(summary), ("translation", "summarization"))
    val = replayed(optional_table(root, f"{HUANG_POLICY.dir}/{SUMMARY_CSV}"))
    if val:
        notes += (
            " Replayed on the validation queries of the collection: "
            + ", ".join(f"{k} {v:.3f}" for k, v in val.items() if not math.isnan(v))
            + "."
        )
    return Exhibit(
        "Huang et al., Table 1: each specialist on both tasks, and the policy",
        table1_frame(root, summary, published, lay),
        table1_verdicts(root, summary, lay),
        notes,
    )


def choices_note(root: Path, run: str, live: dict, tasks: tuple[str, ...]) -> str:
    """A sentence setting the policy's live speedup per task beside the one its arm choices would give
    (``choices_speed``): what is left between them is what choosing costs."""
    from_choices = choices_speed(root, run)
    parts = [
        f"{t} {from_choices[t]:.3f} (live {live.get(t, {}).get('policy', math.nan):.3f})"
        for t in tasks
        if not math.isnan(from_choices.get(t, math.nan))
    ]
    if not parts:
        return ""
    return (
        " The policy's speedup from its choices (each query at the speed its chosen arm ran alone in the same run): "
        + ", ".join(parts)
        + "; the gap to the live speedup is what choosing costs (embedding the prompt, the policy's forward)."
    )


def table1_frame(root: Path, summary: pd.DataFrame, published: list[Published], lay: Layout) -> pd.DataFrame:
    """Table 1's rows (each specialist, the policy): speedup, acceptance and quality per task, the arms the policy
    chose, and the paper's values beside them."""
    sp = speeds(summary)
    rows = [(f"fixed:{d}", d, paper_row) for d, (_, paper_row) in lay.huang_pair.items()] + [
        ("policy", "policy", "policy")
    ]
    cells = {(r.task, r.method): r for r in summary.itertuples()}

    def extra(task: str, method: str) -> dict:
        """The acceptance and quality columns of one cell (quality: BLEU on translation, ROUGE-L on summarization)."""
        r = cells.get((task, method))
        metric = TABLE1_QUALITY.get(task, "")
        return {
            f"{task} acceptance": getattr(r, "acceptance_rate", math.nan) if r else math.nan,
            f"{task} {metric}": getattr(r, metric, math.nan) if r and metric else math.nan,
        }

    chosen = arm_choices(root, HUANG_EVAL.dir)
    table = pd.DataFrame(
        [
            {
                "drafter": label,
                **{t: sp.get(t, {}).get(m, math.nan) for t in ("translation", "summarization")},
                **{k: v for t in ("translation", "summarization") for k, v in extra(t, m).items()},
                "arms chosen (translation / summarization)": " / ".join(
                    choices_text(chosen.get(t)) for t in ("translation", "summarization")
                )
                if m == "policy"
                else "",
            }
            for m, label, _ in rows
        ]
    )
    return with_published(
        table,
        published,
        "huang",
        "table1",
        {label: p for _, label, p in rows},
        ["translation", "summarization"],
    )


def table1_verdicts(root: Path, summary: pd.DataFrame, lay: Layout) -> list[V.Verdict]:
    """Table 1's claims: each specialist fastest on its own task, the policy within WITHIN of each task's best
    specialist, and faster than autoregressive decoding on both tasks (each one verdict over its parts)."""
    pair = {d: task for d, (task, _) in lay.huang_pair.items()}
    ex = load_examples(root, HUANG_EVAL.dir)
    single = {
        t: {d: v for d, v in drafter_speeds(summary).get(t, {}).items() if d in pair} for t in pair.values()
    }
    best = {t: max(v, key=v.get) for t, v in single.items() if v}  # the comparator: the best by its total
    fastest = V.all_of(
        "each specialist speeds up its own task more than the other specialist does",
        [
            (f"{task}: {d} vs {o}", faster_on(ex, "", f"fixed:{d}", f"fixed:{o}", task, run=HUANG_EVAL.dir))
            for d, task in pair.items()
            for o in pair
            if o != d
        ],
        "each part: speedup ratio > 1",
    )
    within = V.all_of(
        WITHIN_CLAIM,
        [
            (
                f"{task}: policy vs {d}",
                faster_on(
                    ex, "", "policy", f"fixed:{d}", task, threshold=WITHIN, at_least=True, run=HUANG_EVAL.dir
                ),
            )
            for task, d in best.items()
        ],
        f"each part: speedup ratio policy / best drafter of the task (by its total) >= {WITHIN}",
    )
    if not best:
        within = V.missing(WITHIN_CLAIM, "the specialists' rows", "speedup ratio")
    both = V.all_of(
        "the policy is faster than autoregressive decoding on both tasks (the paper: 1.09x and 1.17x)",
        [
            (task, faster_on(ex, "", "policy", AUTOREGRESSIVE, task, run=HUANG_EVAL.dir))
            for task in dict.fromkeys(pair.values())
        ],
        "each part: speedup ratio policy / autoregressive > 1",
    )
    return [fastest, within, both]


def huang_fig2(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    df = run_table(root, f"{HUANG_ALPHA.dir}/{ALPHA_SWEEP_CSV}")
    measured = optional_table(root, f"{HUANG_ALPHA_SPEED.dir}/{ALPHA_SWEEP_CSV}")
    shares = [c for c in df.columns if c.startswith("share_")]
    arms = [c.removeprefix("share_") for c in shares]
    cheap, aligned = lay.alpha_arms
    verdict = fig2_verdict(df, cheap, aligned, n_val_of(root, HUANG_ALPHA.dir))
    sweeps = {"parameters": df, **({"measured": measured} if not measured.empty else {})}
    table = pd.concat([s.assign(cost=cost) for cost, s in sweeps.items()], ignore_index=True)
    table = table[["cost", *[c for c in table.columns if c != "cost"]]]

    def plot(path: Path) -> None:
        def draw(ax):
            for (cost, s), style in zip(sweeps.items(), ("-", "--")):
                for a in arms:
                    if f"share_{a}" in s:
                        ax.plot(s.alpha, s[f"share_{a}"], style, marker="o", label=f"{a} ({cost} cost)")

        figure(
            path,
            draw,
            f"Huang et al. Fig. 2 ({lay.scale}): choice vs alpha",
            "alpha (weight of alignment vs cost)",
            "share of validation queries",
        )

    notes = (
        "Proxy reward r = alpha * alignment (ROUGE-L of the drafter's own output to the target's) + (1 - alpha) * "
        f"(1 - cost) (parameters relative to the largest arm); one policy per alpha. Arms: {lay.alpha_note}. "
        "Rows `measured` (when run huang/depth/alpha_speed exists): the same sweep with each arm's cost its measured "
        "speculative seconds per token over the target's (`reward.cost=speed`), the paper's parameter count "
        "replaced by what the arm costs here; the verdict judges the paper's setting."
    )
    return Exhibit(
        "Huang et al., Fig. 2: the alpha trade-off between a cheap and a better-aligned drafter",
        table,
        [verdict],
        notes,
        plot=plot,
    )


def fig2_verdict(df: pd.DataFrame, cheap: str, aligned: str, n_val: int | None) -> V.Verdict:
    """Fig. 2's claim on the sweep: a majority of the validation queries on the cheap drafter at the lowest alpha
    and on the better-aligned one at the highest (``n_val``: the validation queries behind each share)."""
    lo, hi = df.loc[df.alpha.idxmin()], df.loc[df.alpha.idxmax()]
    claim = "the alpha sweep moves the choice from the cheap drafter (alpha 0) to the better-aligned one (alpha 1)"
    if f"share_{cheap}" not in df or f"share_{aligned}" not in df:
        return V.missing(claim, f"shares of {cheap} and {aligned}")
    elif n_val is None:
        return V.unpaired(
            claim,
            "the number of validation queries behind the shares is unknown (no n_val in "
            f"{HUANG_ALPHA.dir}/metrics.json)",
            "share",
        )
    else:
        # a share of n validation queries is k = share * n queries given that arm: the per-query hits
        def hits(share: float) -> list[float]:
            k = int(round(float(share) * n_val))
            return [1.0] * k + [0.0] * (n_val - k)

        return V.all_of(
            claim,
            [
                (
                    f"alpha {lo.alpha:g}: share of {cheap}",
                    V.majority("", hits(lo[f"share_{cheap}"]), f"share of {cheap}"),
                ),
                (
                    f"alpha {hi.alpha:g}: share of {aligned}",
                    V.majority("", hits(hi[f"share_{aligned}"]), f"share of {aligned}"),
                ),
            ],
            "each part: a majority of the validation queries, share > 0.5",
        )


# make huang-fig3 (outside the plan): 1,000+ training queries; make huang-fig3-pool: the harder pool
FIG3_SWEEP = f"huang/fig3/policy/{DATA_EFFICIENCY_CSV}"
FIG3_POOL_SWEEP = f"huang/fig3_pool/policy/{DATA_EFFICIENCY_CSV}"
SPECIALISTS, ONE_TEMPLATE = "two specialists, one per template", "seven drafters, one template"
FIG3_CLAIM = "more training queries give a higher speed than the fewest"


def fig3_verdict(df: pd.DataFrame, queries: Path) -> V.Verdict:
    """Fig. 3's claim: the most training queries against the fewest, paired per validation query when the sweep
    kept each size's per-query runs (``queries``), else shown unpaired."""
    first, last = df.iloc[0], df.iloc[-1]
    if not queries.is_file():
        return V.unpaired(
            FIG3_CLAIM,
            f"{NOT_PAIRED}; aggregates: {int(last.n_examples)} queries "
            f"{last.speedup_replayed:.3f} vs {int(first.n_examples)} {first.speedup_replayed:.3f}",
            "speedup ratio",
        )
    q = read_table(queries)  # each size's chosen arm per validation query: paired
    most, fewest = (q[q.n_examples == n].set_index("query_id") for n in (last.n_examples, first.n_examples))
    ids = most.index.intersection(fewest.index)
    return V.faster(
        FIG3_CLAIM,
        (most.seconds[ids], most.new_tokens[ids]),
        (fewest.seconds[ids], fewest.new_tokens[ids]),
        names=(f"{int(last.n_examples)} queries", f"{int(first.n_examples)} queries"),
    )


def headroom(df: pd.DataFrame) -> str:
    """What a policy could gain on a pool: the per-query oracle against the best single arm, and the policy at the
    fewest and the most training queries (the sweep's own rows)."""
    first, last = df.iloc[0], df.iloc[-1]
    if not {"oracle_speedup", "best_single_speedup"} <= set(df.columns):
        return (
            f"policy {first.speedup_replayed:.3f}x at {int(first.n_examples)} training queries, "
            f"{last.speedup_replayed:.3f}x at {int(last.n_examples)}"
        )
    gain = last.oracle_speedup / last.best_single_speedup - 1
    return (
        f"per-query oracle {last.oracle_speedup:.3f}x against the best single drafter's {last.best_single_speedup:.3f}x "
        f"(headroom {gain:.1%}); policy {first.speedup_replayed:.3f}x at {int(first.n_examples)} training queries, "
        f"{last.speedup_replayed:.3f}x at {int(last.n_examples)}"
    )


def fig3_pools(root: Path) -> list[tuple[str, pd.DataFrame, Path]]:
    """Each pool's sweep (name, its table by training size, its per-query file): ``make huang-fig3``'s when it exists
    under ``root`` (else Table 1's small one), and ``make huang-fig3-pool``'s when it exists."""
    big = Path(root) / FIG3_SWEEP
    first = read_table(big) if big.is_file() else run_table(root, f"{HUANG_POLICY.dir}/{DATA_EFFICIENCY_CSV}")
    at = big if big.is_file() else Path(root) / HUANG_POLICY.dir / DATA_EFFICIENCY_CSV
    pools = [(SPECIALISTS, first.sort_values("n_examples"), at.with_name(DATA_EFFICIENCY_QUERIES_CSV))]
    hard = Path(root) / FIG3_POOL_SWEEP
    if hard.is_file():
        pools.append(
            (
                ONE_TEMPLATE,
                read_table(hard).sort_values("n_examples"),
                hard.with_name(DATA_EFFICIENCY_QUERIES_CSV),
            )
        )
    return pools


def huang_fig3(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    """Fig. 3 from ``make huang-fig3``'s sweep when it exists under ``root`` (1,000+ training queries, replayed from a
    trace), else from Table 1's policy run (its few collected queries); with ``make huang-fig3-pool``'s harder pool
    beside it when that exists, the claim judged once over both pools (each must hold)."""
    pools = fig3_pools(root)
    parts = [(name, fig3_verdict(df, queries)) for name, df, queries in pools]
    verdict = parts[0][1] if len(parts) == 1 else V.all_of(FIG3_CLAIM, parts)
    df = pools[0][1] if len(pools) == 1 else pd.concat([d.assign(pool=name) for name, d, _ in pools])

    def plot(path: Path) -> None:
        def draw(ax):
            for (name, d, _), style in zip(pools, ("-", "-."), strict=False):
                tag = f" ({name})" if len(pools) > 1 else ""
                ax.plot(d.n_examples, d.speedup_replayed, marker="o", ls=style, label="policy" + tag)
                if "oracle_speedup" in d:
                    ax.plot(
                        d.n_examples, d.oracle_speedup, ls="--", color="gray", label="per-query oracle" + tag
                    )
                for column, color, label in (
                    ("best_single_speedup", "green", "best single arm"),
                    ("random_speedup", "red", "random arm"),
                ):
                    if column in d:
                        ax.plot(d.n_examples, d[column], ls=":", color=color, label=label + tag)

        figure(
            path,
            draw,
            f"Huang et al. Fig. 3 ({lay.scale}): speed vs training queries",
            "training queries (log scale)",
            "speedup (replayed, validation)",
            xscale="log",
        )

    return Exhibit(
        "Huang et al., Fig. 3: speed against the number of training queries",
        df,
        [verdict],
        fig3_notes(root, pools, lay),
        plot=plot,
    )


def fig3_notes(root: Path, pools: list[tuple[str, pd.DataFrame, Path]], lay: Layout) -> str:
    """Where each pool's sweep comes from, and what each leaves a policy to learn (``headroom``)."""
    if (Path(root) / FIG3_SWEEP).is_file():
        notes = (
            "Speedup of the chosen arms on the same validation queries (a fifth of the collection), each arm's run "
            "replayed from one greedy acceptance trace of every query (`make huang-fig3`: 1,332 queries of "
            "IWSLT2017 and XSum disjoint from the heads' training rows and from Table 1's, 16 new tokens each; times "
            "predicted from the cost curves measured with the trace); the policy trains on the acceptance reward "
            f"(reward.alignment=acceptance). Runs: `{Path(FIG3_SWEEP).parent.parent}`. The paper trains on 1k-10k."
        )
    else:
        notes = (
            "Replayed speedup of the chosen arms' measured speculative runs on the same validation queries; "
            f"{lay.training_note} `make huang-fig3` sweeps to 1,000+ training queries."
        )
    if len(pools) > 1:
        notes += (
            f" The harder pool (`make huang-fig3-pool`, runs `{Path(FIG3_POOL_SWEEP).parent.parent}`): the six "
            "shipped heads and the small drafter on 1,000 IWSLT2017 test rows of one template, traced and replayed "
            "the same way, so the best drafter cannot be read off a query's template."
        )
    learn = "; ".join(f"{name}: {headroom(d)}" for name, d, _ in pools)
    return f"{notes} What each pool leaves a policy to learn: {learn}."


def huang_table4(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    run = HUANG_MATH_EVAL.dir
    summary = run_table(root, f"{run}/{SUMMARY_CSV}")
    best = best_fixed(summary)
    table = table4_frame(root, summary, published, best)
    ex = load_examples(root, run)

    claim = "with the autoregressive arm the policy is faster than drafting alone (the best drafter)"
    premise = (
        "the premise: drafting alone slows math, autoregressive decoding is faster than the best drafter "
        "(the paper: drafting about 0.75x)"
    )
    verdicts = [
        faster_on(ex, premise, AUTOREGRESSIVE, best, names=("autoregressive", short_name(best)), run=run)
        if best
        else V.missing(premise, f"the fixed drafters' rows ({run}/summary.csv)", "speedup ratio"),
        faster_on(ex, claim, "policy", best, names=("policy", short_name(best)), run=run)
        if best
        else V.missing(claim, f"the fixed drafters' rows ({run}/summary.csv)", "speedup ratio"),
        faster_on(
            ex,
            f"the policy holds at least {TABLE4_POLICY}x of autoregressive speed (the paper: about "
            f"{TABLE4_POLICY}x)",
            "policy",
            AUTOREGRESSIVE,
            threshold=TABLE4_POLICY,
            at_least=True,
            run=run,
        ),
    ]
    return Exhibit(
        "Huang et al., Table 4: math, with the autoregressive arm",
        table,
        verdicts,
        f"GSM8K test rows: speedup of the policy evaluated live on {lay.held_out} held-out rows (after the "
        "collected ones), beside each drafter alone in the same run; `replayed`: the collection's "
        f"validation queries replayed (train-policy). Reward: {lay.table4_reward} The row with a measured cost "
        "trains the same policy with each arm's cost set to its measured speculative seconds per token over the "
        "target's (`reward.cost=speed`, run huang/math/policy_speed) instead of its parameter count: replayed "
        "only, shown, not judged. `from its choices`: the speedup the live policy's arm choices would give if each "
        "query ran at the speed its chosen arm ran alone in the same run; the gap to `speedup` is what choosing "
        "costs (embedding the prompt, the policy's forward).",
    )


def table4_frame(
    root: Path, summary: pd.DataFrame, published: list[Published], best: str | None
) -> pd.DataFrame:
    """Table 4's rows: each drafter alone, the best of them, and the policy with the autoregressive arm (live, and
    replayed on the collection's validation queries), with the arms the policy chose and the paper's values."""
    run = HUANG_MATH_EVAL.dir
    live = speeds(summary).get(ALL_TASKS, {})
    sp = replayed(optional_table(root, f"{HUANG_MATH_POLICY.dir}/{SUMMARY_CSV}"))
    alone = {m.split(":", 1)[1]: v for m, v in live.items() if m.startswith("fixed:")}
    table = pd.DataFrame(
        [
            {
                "method": f"{a} alone",
                "speedup": v,
                "replayed": sp.get(f"always {a}", math.nan),
                "arms chosen (queries)": "",
            }
            for a, v in alone.items()
        ]
        + [
            {
                "method": "drafting alone (best drafter)",
                "speedup": live.get(best, math.nan) if best else math.nan,
                "replayed": max(
                    (v for k, v in sp.items() if k.startswith("always ") and k != "always autoregressive"),
                    default=math.nan,
                ),
                "arms chosen (queries)": "",
            },
            {
                "method": "policy with the autoregressive arm",
                "speedup": live.get("policy", math.nan),
                "from its choices": choices_speed(root, run).get(ALL_TASKS, math.nan),
                "replayed": sp.get("policy", math.nan),
                "arms chosen (queries)": choices_text(arm_choices(root, run).get(ALL_TASKS)),
            },
            *measured_cost_rows(
                root, HUANG_MATH_POLICY_SPEED, "policy with the autoregressive arm, measured cost"
            ),
        ]
    )
    return with_published(
        table,
        published,
        "huang",
        "table4",
        {
            "drafting alone (best drafter)": "drafting alone",
            "policy with the autoregressive arm": "policy with the autoregressive arm",
        },
        ["speedup"],
    )


def measured_cost_rows(root: Path, run: Run, method: str) -> list[dict]:
    """The row of a policy trained (run ``run``) with each arm's measured cost (its speculative seconds per token
    over the target's, ``reward.cost=speed``) instead of the paper's parameter count: replayed on the collection's
    validation queries, with the arms it chose there (no row before that run exists)."""
    metrics = policy_metrics(root, run.dir)
    if not metrics:
        return []
    replayed_speed = (metrics.get("speedup_replayed") or {}).get("policy", math.nan)
    return [
        {
            "method": method,
            "speedup": math.nan,
            "replayed": float(replayed_speed),
            "arms chosen (queries)": choices_text(validation_choices(metrics)) + " (validation)",
        }
    ]


def table6_rows(root: Path, without_run: str, with_run: str) -> pd.DataFrame:
    """Table 6's rows: each drafter alone (live, replayed), the two live policies, the measured-cost policies."""
    without_s, with_s = (
        run_table(root, f"{without_run}/{SUMMARY_CSV}"),
        run_table(root, f"{with_run}/{SUMMARY_CSV}"),
    )
    live = speeds(without_s).get(ALL_TASKS, {})
    without = replayed(optional_table(root, f"{HUANG_WITHOUT_AR.dir}/{SUMMARY_CSV}"))
    with_ar = replayed(optional_table(root, f"{HUANG_WITH_AR.dir}/{SUMMARY_CSV}"))
    return pd.DataFrame(
        [
            {
                "method": f"{m.split(':', 1)[1]} alone",
                "speedup": v,
                "replayed": with_ar.get(f"always {m.split(':', 1)[1]}", math.nan),
                "arms chosen (queries)": "",
            }
            for m, v in live.items()
            if m.startswith("fixed:")
        ]
        + [
            {
                "method": "policy without the autoregressive arm",
                "speedup": live.get("policy", math.nan),
                "from its choices": choices_speed(root, without_run).get(ALL_TASKS, math.nan),
                "replayed": without.get("policy", math.nan),
                "arms chosen (queries)": choices_text(arm_choices(root, without_run).get(ALL_TASKS)),
            },
            {
                "method": "policy with the autoregressive arm",
                "speedup": speeds(with_s).get(ALL_TASKS, {}).get("policy", math.nan),
                "replayed": with_ar.get("policy", math.nan),
                "arms chosen (queries)": choices_text(arm_choices(root, with_run).get(ALL_TASKS)),
            },
            *measured_cost_rows(
                root, HUANG_WITHOUT_AR_SPEED, "policy without the autoregressive arm, measured cost"
            ),
            *measured_cost_rows(
                root, HUANG_WITH_AR_SPEED, "policy with the autoregressive arm, measured cost"
            ),
        ]
    )


def huang_table6(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    without_run, with_run = HUANG_EVAL_WITHOUT_AR.dir, HUANG_EVAL_WITH_AR.dir
    table = table6_rows(root, without_run, with_run)
    claim = "adding the autoregressive arm makes the policy faster"
    verdict = relative_faster(
        claim,
        load_examples(root, with_run),
        load_examples(root, without_run),
        "policy",
        ("with the AR arm", "without"),
        (with_run, without_run),
    )
    return Exhibit(
        "Huang et al., Table 6: drafters at several depths, with and without the autoregressive arm",
        table,
        [verdict],
        f"{lay.depth_note}. Each policy evaluated live on {lay.held_out} held-out rows, each run with its own "
        "autoregressive baseline (the two runs are separate processes, so the verdict compares each policy's "
        "per-query speedup over its own run's autoregressive decoding of the same query); `replayed`: the "
        f"collection's validation queries replayed. Reward: {lay.table6_reward} The rows with a measured cost train "
        "the same policies with each arm's cost set to its measured speculative seconds per token over the "
        "target's (`reward.cost=speed`, runs huang/depth/without_ar_speed and with_ar_speed) instead of its "
        "parameter count: replayed only, with the arms chosen on the validation queries. `from its choices`: the "
        "speedup the live policy's arm choices would give if each query ran at the speed its chosen arm ran alone "
        "in the same run (the run with the autoregressive arm has no single-drafter rows).",
    )


TABLE1 = ExhibitSpec("huang/table1", huang_table1, (HUANG_EVAL, HUANG_POLICY), ("huang/table1",))
FIG2 = ExhibitSpec("huang/fig2", huang_fig2, (HUANG_DEPTH_COLLECT, HUANG_ALPHA, HUANG_ALPHA_SPEED))
FIG3 = ExhibitSpec("huang/fig3", huang_fig3, (HUANG_POLICY,))
TABLE4 = ExhibitSpec(
    "huang/table4",
    huang_table4,
    (HUANG_MATH_COLLECT, HUANG_MATH_POLICY, HUANG_MATH_POLICY_SPEED, HUANG_MATH_EVAL),
    ("huang/table4",),
)
TABLE6 = ExhibitSpec(
    "huang/table6",
    huang_table6,
    (
        HUANG_DEPTH_COLLECT,
        HUANG_WITHOUT_AR,
        HUANG_WITH_AR,
        HUANG_WITHOUT_AR_SPEED,
        HUANG_WITH_AR_SPEED,
        HUANG_EVAL_WITHOUT_AR,
        HUANG_EVAL_WITH_AR,
    ),
)
EXHIBITS = (TABLE1, FIG2, FIG3, TABLE4, TABLE6)
