"""Speculative cascades: quality against speedup of each deferral rule, against plain SD (greedy) or lossy SD
(temperature sampling) at equal quality. (The Spec-Bench leaderboard's reference rows: ``spec_bench.py``.)"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pandas as pd

from specbench.records import CURVES_CSV
from specbench.reproduction import intervals as CI
from specbench.reproduction import verdicts as V
from specbench.reproduction.compare import (
    called,
    pair_columns,
    paired,
    timed,
)
from specbench.reproduction.exhibit import CascadeRun, Exhibit, ExhibitSpec, Layout
from specbench.reproduction.inputs import (
    load_examples,
    margin_in_units,
    run_table,
    task_columns,
    task_quality,
)
from specbench.reproduction.premises import CASCADE_MARGIN_POINTS
from specbench.reproduction.published import Published
from specbench.reproduction.runs import (
    CASCADES_GREEDY,
    CASCADES_PAPER,
    CASCADES_SAMPLING,
    CASCADES_SUMMARIZATION,
    EXAMPLES,
)


def cascade_points(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, method) with a quality metric: the family it belongs to, speedup, tokens per target call
    (MAT), deferral rate, the task's metric, and agreement with the target's output (tokens)."""
    keep = [
        c
        for c in (
            "task",
            "method",
            "rule",
            "alpha",
            "metric",
            "quality",
            "speedup",
            "mat",
            "deferral_rate",
            "agreement_tokens",
            "n_examples",
        )
        if c in curves
    ]
    out = curves[keep].copy()
    out.insert(2, "family", [family(m) for m in out.method])
    return out.rename(columns={"mat": "tokens_per_target_call", "agreement_tokens": "agreement"})


SPECULATIVE, LOSSY, SEQUENTIAL_FAMILY = "speculative cascade", "lossy SD", "sequential cascade"


def family(method: str) -> str:
    """autoregressive | drafter alone | lossy SD (plain SD is its alpha 0) | sequential cascade | speculative cascade."""
    from specbench.pipelines.cascade_curves import ALONE, SD

    m = str(method)
    if m == SD or m.startswith("lossy_sd@"):
        return LOSSY
    if m.startswith("sequential@"):
        return SEQUENTIAL_FAMILY
    if "@" in m:
        return SPECULATIVE
    return "drafter alone" if m == ALONE else m


def points_plot(pts: pd.DataFrame, tasks: list[str], title: str) -> Callable[[Path], None]:
    """The exhibit's figure: quality against speedup per task, each family in its colour, the target's line."""

    def plot(path: Path) -> None:
        from specbench.pipelines.tables import pyplot

        plt = pyplot()
        fig, axes = plt.subplots(
            1, max(len(tasks), 1), figsize=(4.2 * max(len(tasks), 1), 3.8), squeeze=False
        )
        for ax, task in zip(axes[0], tasks):
            sub = pts[pts.task == task]
            for fam, color in (
                (SPECULATIVE, "tab:blue"),
                (LOSSY, "tab:orange"),
                (SEQUENTIAL_FAMILY, "tab:green"),
            ):
                f = sub[sub.family == fam]
                if len(f):
                    ax.scatter(f.speedup, f.quality, color=color, s=18, label=fam)
            alone = sub[sub.method == "drafter_alone"]
            if len(alone):
                ax.plot(alone.speedup, alone.quality, "kx", markersize=9, label="drafter alone")
            ar = sub[sub.method == "autoregressive"]
            if len(ar):
                ax.axhline(
                    float(ar.quality.iloc[0]), color="k", ls=":", lw=1, label="target (autoregressive)"
                )
            ax.set(xlabel="speedup over autoregressive", ylabel=str(sub.metric.iloc[0]), title=task)
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    return plot


def cascades(root: Path, published: list[Published], lay: Layout, run: CascadeRun) -> Exhibit:
    curves = run_table(root, f"{run.run.dir}/{CURVES_CSV}")
    pts = cascade_points(curves)
    tasks = [t for t in dict.fromkeys(pts.task) if pts[pts.task == t].quality.notna().any()]

    columns = task_columns(curves)
    notes = (
        f"Quality: {run.quality_label or quality_text(columns)}. The dotted line of each panel is the target's own quality (its "
        "autoregressive run on the same queries). tokens_per_target_call: new tokens per target forward (MAT). "
        "Families: lossy SD (plain SD is its alpha 0; under greedy decoding lossy SD is plain SD for alpha < 1, "
        "so plain SD is its point), the sequential cascade (the drafter generates; a position it is unsure of, "
        "Chow's test on its own distribution, is deferred to the target, called only then), and the speculative "
        "cascades (chow, diff, opt, token_*: the deferral decided with the target's scores, in parallel). "
        "Verdicts, per task: each family's fastest point at the target's quality, judged by a paired test, not by "
        f"point estimates: the 95% {CI.INTERVAL_TEXT} of its per-query quality difference to the target lies above "
        "minus a margin fixed beforehand, 1 point of the task's metric (a hundredth of an accuracy); then the "
        "speculative cascade's point against the other two "
        "families' points, paired per query, speed with that interval at a level Bonferroni-corrected over "
        "the speculative points picked from. The curve's quality side (greedy runs): at that point's tokens per "
        "target call, each baseline family's nearest point (within 10%) has lower quality, paired per query. A "
        "task whose target lies less than 2 points of its metric above the drafter alone cannot tell the two "
        "apart, so its parts are not testable here (premises.py: cascades/separability)."
    )
    ex = load_examples(root, run.run.dir)
    return Exhibit(
        f"Speculative cascades, quality against speedup ({run.title})",
        pts,
        cascade_verdicts(ex, run, columns),
        notes + quality_note(quality_intervals(ex, columns)) + separation_note(metric_separation(ex)),
        plot=points_plot(
            pts, tasks, f"Speculative cascades ({lay.scale}, {run.name}): task quality vs speed"
        ),
    )


def quality_intervals(ex: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """Per task with a metric (``columns``: :func:`task_columns`) and per point of the run: its per-query quality
    minus the target's, paired, with the verdicts' 95% interval, the task's margin (:func:`quality_margin`) and
    what the interval shows (:func:`quality_shows`). The drafter alone is shown too, as the floor."""
    from specbench.arms import AUTOREGRESSIVE

    rows = []
    for task in dict.fromkeys(ex.task) if not ex.empty else ():
        if task not in columns:
            continue
        sub = ex[ex.task == task]
        sub = sub.assign(_q=task_quality(sub, columns[task]))
        margin = quality_margin(sub, columns[task])
        for m in dict.fromkeys(sub.method):
            if m == AUTOREGRESSIVE:
                continue
            p = paired(sub, [m, AUTOREGRESSIVE])
            gap = quality_gap(p, m)
            if gap is None:
                continue
            mean, lo, hi = gap
            rows.append(
                {
                    "task": task,
                    "method": m,
                    "family": family(m),
                    "metric": columns[task],
                    "n": int(p[m]._q.notna().sum()),
                    "difference": mean,
                    "ci_low": lo,
                    "ci_high": hi,
                    "margin": margin,
                    "shows": quality_shows(gap, margin),
                }
            )
    return pd.DataFrame(rows)


def quality_note(table: pd.DataFrame) -> str:
    """The per-point quality intervals as a paragraph of the exhibit's notes (empty without rows)."""
    if table.empty:
        return ""
    from specbench.pipelines.tables import to_markdown

    return (
        "\n\nEach point's quality against the target's, paired per query (the point's score minus the target's, "
        f"95% {CI.INTERVAL_TEXT}; margin: 1 point of the metric, fixed beforehand; shows: at the target's quality when the "
        "interval lies above minus the margin, below when it lies wholly under it, cannot tell otherwise):\n\n"
        + to_markdown(table)
    )


def metric_separation(ex: pd.DataFrame) -> pd.DataFrame:
    """Per task and per-query metric the records hold: how far the target's quality lies above the drafter alone's
    on the same queries (the paired mean difference, its 95% interval, and the difference over its
    standard deviation): which metric can tell the target from its drafter on these queries at all."""
    from specbench.arms import AUTOREGRESSIVE
    from specbench.pipelines.cascade_curves import ALONE

    rows = []
    for task in dict.fromkeys(ex.task) if not ex.empty else ():
        p = paired(ex, [AUTOREGRESSIVE, ALONE], task)
        if p[AUTOREGRESSIVE].empty:
            continue
        keys = sorted(
            {k for q in p[AUTOREGRESSIVE].quality if isinstance(q, dict) for k in q if k != "output_words"}
        )
        for key in keys:
            target, alone = metric_scores(p[AUTOREGRESSIVE], key), metric_scores(p[ALONE], key)
            d = (target - alone).dropna()
            if len(d) < 2:
                continue
            mean, lo, hi = CI.bootstrap({"d": d.to_numpy(float)}, CI.mean_of("d"))
            sd = float(d.std(ddof=1))
            rows.append(
                {
                    "task": task,
                    "metric": key,
                    "n": len(d),
                    "target, mean per query": float(target.mean()),
                    "drafter alone, mean per query": float(alone.mean()),
                    "difference": mean,
                    "ci_low": lo,
                    "ci_high": hi,
                    "difference / sd": mean / sd if sd > 0 else math.nan,
                }
            )
    return pd.DataFrame(rows)


def metric_scores(records: pd.DataFrame, key: str) -> pd.Series:
    """Each record's per-query score on metric ``key`` (NaN where it has none), in the records' order."""
    return pd.Series(
        [q.get(key) if isinstance(q, dict) else None for q in records.quality], dtype=float
    ).reset_index(drop=True)


def separation_note(table: pd.DataFrame) -> str:
    """The metric-separation table as a paragraph of the exhibit's notes (empty without rows)."""
    if table.empty:
        return ""
    from specbench.pipelines.tables import to_markdown

    return (
        "\n\nWhich metric separates the target from its drafter alone on these queries (per query: the target's "
        "score minus the drafter's, paired; a metric whose interval includes 0 cannot tell the target's quality "
        "from the drafter's here, so a test of being at the target's quality on it is weak). Scores here are means of "
        "per-query scores (sentence BLEU for translation); the quality column of the table above is the task's "
        "metric over all queries at once (corpus BLEU), so the two differ for the same target:\n\n"
        + to_markdown(table)
    )


def quality_text(columns: dict[str, str]) -> str:
    """How a page names the tasks' quality columns."""
    from specbench.tasks.registry import quality_label

    return "each task's own metric: " + ", ".join(f"{quality_label(t, c)} ({t})" for t, c in columns.items())


def quality_gap(p: dict[str, pd.DataFrame], m: str) -> tuple[float, float, float] | None:
    """(mean, lo, hi): ``m``'s per-query quality minus the target's (autoregressive) on the queries both ran and
    scored (``p``: their records paired by query, ``compare.paired``), with the verdicts' paired interval;
    None without such queries."""
    from specbench.arms import AUTOREGRESSIVE

    d = (p[m]._q - p[AUTOREGRESSIVE]._q).dropna() if not p[m].empty else pd.Series(dtype=float)
    if d.empty:
        return None
    return CI.bootstrap({"d": d.to_numpy(float)}, CI.mean_of("d"))


LOSSLESS_SD = (
    "sd"  # the lossless SD point of a cascades run: its quality scatter against the target's sets the margin
)


def quality_margin(ex: pd.DataFrame, metric: str = "") -> float:
    """The non-inferiority margin of a point's quality against the target's: a fixed number of the metric's points
    stated beforehand (:func:`margin_in_units`). (Until issue 67 it was lossless SD's own scatter, the larger end of
    its paired interval, which shrinks like 1/sqrt(n), so that no lossy point could pass at a large n.)"""
    return margin_in_units(metric, CASCADE_MARGIN_POINTS)


AT_QUALITY, BELOW_QUALITY, CANNOT_TELL = "at the target's quality", "below", "cannot tell"


def quality_shows(gap: tuple[float, float, float], margin: float) -> str:
    """What a point's paired interval of the quality difference to the target (``quality_gap``) shows at ``margin``:
    at the target's quality (non-inferior: the interval lies above ``-margin``), below it (wholly under), or cannot
    tell (straddling it)."""
    _, lo, hi = gap
    return AT_QUALITY if lo >= -margin else BELOW_QUALITY if hi < -margin else CANNOT_TELL


def at_target_quality(
    ex: pd.DataFrame, methods: list[str], margin: float = 0.0, cost: str = "seconds"
) -> list[tuple[float, str]]:
    """(speedup, method) of each of ``methods`` at the target's quality, fastest first: its paired 95% interval of the
    per-query quality difference to the target (autoregressive) lies above ``-margin`` (non-inferior; ``margin``:
    :func:`quality_margin`); speedup: total autoregressive ``cost`` per token / the method's, on those queries
    (``seconds``: wall-clock; ``target_calls``: the method's tokens per target call over the target's, 1 a call)."""
    from specbench.arms import AUTOREGRESSIVE

    out = []
    for m in methods:
        p = paired(ex, [m, AUTOREGRESSIVE])
        gap = quality_gap(p, m)
        if gap is not None and quality_shows(gap, margin) == AT_QUALITY:
            out.append((float(CI.speed_ratio()(pair_columns(p[m], p[AUTOREGRESSIVE], cost))), m))
    return sorted(out, reverse=True)


def cascade_verdicts(ex: pd.DataFrame, run: CascadeRun, columns: dict[str, str]) -> list[V.Verdict]:
    """Per task with a metric: at the target's quality, the fastest speculative-cascade point is faster than the
    fastest lossy-SD point and the fastest sequential-cascade point (each family's points non-inferior to the
    target's quality by a paired interval, margin fixed beforehand: :func:`at_target_quality`), paired per
    query; on greedy runs also the curve's quality side (:func:`curve_verdict`). ``columns``: each task's quality column (:func:`task_columns`)."""
    if ex.empty:
        return [V.missing(CASCADE_CLAIM, f"per-query records ({run.run.dir}/{EXAMPLES})", CASCADE_LABEL)]
    methods = list(dict.fromkeys(ex.method))
    out = []
    for task in dict.fromkeys(ex.task):
        if task not in columns:
            continue
        sub = ex[ex.task == task]
        out.append(
            V.keyed(task_verdict(sub, task, methods, columns[task]), f"{run.run.dir}#at-quality:{task}")
        )
        if run.greedy:
            out.append(
                V.keyed(curve_verdict(sub, task, methods, columns[task]), f"{run.run.dir}#curve:{task}")
            )
    return out or [V.unpaired(CASCADE_CLAIM, "no task of the run has a quality metric", CASCADE_LABEL)]


MATCHED = 0.10  # "matched tokens per target call": a baseline point within 10% of the cascade point's, fixed beforehand


def curve_verdict(sub: pd.DataFrame, task: str, methods: list[str], key: str) -> V.Verdict:
    """The quality side of the curve: at the operating point of the speculative cascade with the most tokens per
    target call at the target's quality (:func:`at_target_quality`), each baseline family's point nearest it in
    tokens per target call (within MATCHED) has lower quality, paired per query (one part per family)."""
    named = (
        f"on {task}, at matched tokens per target call a speculative cascade gives higher quality than lossy SD and "
        "the sequential cascade"
    )
    label = f"{key} difference speculative cascade - baseline"
    sub = sub.assign(_q=task_quality(sub, key))
    margin = quality_margin(sub, key)
    spec = at_target_quality(sub, [m for m in methods if family(m) == SPECULATIVE], margin, AXIS)
    if not spec:
        return V.unpaired(named, "no speculative-cascade point is shown at the target's quality", label)
    best = spec[0][1]
    calls = tokens_per_call(sub)
    parts = []
    for fam in (LOSSY, SEQUENTIAL_FAMILY):
        points = [m for m in methods if family(m) == fam and m in calls]
        if not points:
            continue
        near = min(points, key=lambda m: abs(math.log(calls[m] / calls[best])))
        if abs(calls[near] / calls[best] - 1) > MATCHED:
            parts.append(
                (
                    fam,
                    V.unpaired(
                        "",
                        f"no {fam} point within {MATCHED:.0%} of {best}'s tokens per call "
                        f"({calls[best]:.3f}; nearest {near} {calls[near]:.3f})",
                        label,
                    ),
                )
            )
            continue
        p = paired(sub, [best, near])
        keep = p[best]._q.notna() & p[near]._q.notna()
        parts.append(
            (
                f"{best} ({calls[best]:.3f} tokens a call) vs {near} ({calls[near]:.3f})",
                V.greater_mean("", list(p[best]._q[keep]), list(p[near]._q[keep]), label),
            )
        )  # fmt: skip
    if not parts:
        return V.unpaired(named, "the run has no baseline point", label)
    return V.all_of(
        named, parts, f"each part: quality difference > 0; matched within {MATCHED:.0%} tokens per call"
    )


def tokens_per_call(sub: pd.DataFrame) -> dict[str, float]:
    """Each method's new tokens per target call over the queries it ran (its MAT)."""
    g = sub.groupby("method")[["new_tokens", "target_calls"]].sum()
    return {m: float(r.new_tokens / r.target_calls) for m, r in g.iterrows() if r.target_calls > 0}


# "faster" on the seed's axis: new tokens per target forward (the speculative cascades paper's cost is the target's
# calls); the wall-clock ratio of the same pair is printed beside each part, not judged
AXIS = "target_calls"
CASCADE_WHAT = "tokens per target call ratio"
CASCADE_LABEL = f"{CASCADE_WHAT} speculative cascade / baseline"
CASCADE_CLAIM = (
    "at the target's quality a speculative cascade is faster (in tokens per target call) than lossy SD and the "
    "sequential cascade"
)


def task_verdict(sub: pd.DataFrame, task: str, methods: list[str], key: str) -> V.Verdict:
    """One task's cascade claim (``cascade_verdicts``): one verdict over its two baselines (lossy SD, the sequential
    cascade), the speculative point chosen among those at the target's quality with Bonferroni's level; quality on
    the column ``key``."""
    label = CASCADE_LABEL
    sub = sub.assign(_q=task_quality(sub, key))
    named = f"on {task}, {CASCADE_CLAIM}"
    target_q = sub[sub.method == "autoregressive"]._q
    if target_q.notna().any() and not (target_q.fillna(0) != 0).any():
        return V.unpaired(
            named,
            f"the target scores 0 on {key} on every query here, so the "
            "target's quality line cannot tell one point from another",
            label,
        )
    margin = quality_margin(sub, key)
    spec = at_target_quality(sub, [m for m in methods if family(m) == SPECULATIVE], margin, AXIS)
    if not spec:
        return no_point_verdict(sub, named, [m for m in methods if family(m) == SPECULATIVE], margin)
    best = spec[0][1]
    level = V.bonferroni(len(spec))
    parts = [baseline_part(sub, best, fam, methods, margin, level) for fam in (LOSSY, SEQUENTIAL_FAMILY)]
    return V.all_of(
        named,
        parts,
        f"{key} non-inferior to the target's (paired 95% interval of the quality difference "
        f"above -{margin:.3g}, a margin fixed beforehand); the point with the most tokens per target call of "
        f"{len(spec)} speculative points at the target's quality, level {level:.2%} (Bonferroni); wall-clock "
        "beside each part, not judged",
    )


def baseline_part(
    sub: pd.DataFrame, best: str, fam: str, methods: list[str], margin: float, level: float
) -> tuple[str, V.Verdict]:
    """One part of a task's cascade verdict: ``best`` against family ``fam``'s point with the most tokens per target
    call at the target's quality, judged on tokens per target call, the wall-clock ratio of the pair in its detail."""
    base = at_target_quality(sub, [m for m in methods if family(m) == fam], margin, AXIS)
    if not base:
        why = f"no {fam} point reaches the target's quality on these queries"
        return fam, V.unpaired("", why, CASCADE_LABEL)
    b = base[0][1]
    p = paired(sub, [best, b])
    boot = CI.Bootstrap(level=level)
    clock = V.faster("", timed(p[best]), timed(p[b]), (best, b), boot=boot)
    verdict = V.faster("", called(p[best]), called(p[b]), (best, b), what=CASCADE_WHAT, boot=boot)
    return f"{best} vs {b} ({fam})", replace(verdict, detail=f"wall-clock beside: {clock.stats}")


def no_point_verdict(sub: pd.DataFrame, named: str, points: list[str], margin: float) -> V.Verdict:
    """The cascade claim when no speculative point is shown non-inferior to the target: not held only when every
    point is shown inferior (its paired 95% interval of the quality difference lies wholly below ``-margin``);
    otherwise inconclusive, since a point whose interval straddles the margin may be at the target's quality and
    these queries cannot tell."""
    from specbench.arms import AUTOREGRESSIVE

    gaps = [quality_gap(paired(sub, [m, AUTOREGRESSIVE]), m) for m in points]
    shown = [g for g in gaps if g is not None]
    n = int((sub.method == AUTOREGRESSIVE).sum())
    if not shown:
        return V.unpaired(
            named, "the run has no speculative-cascade point scored on these queries", CASCADE_LABEL
        )
    if n < CI.MIN_N:
        return V.Verdict(
            named, None, f"fewer than {CI.MIN_N} paired queries", n=n, label=CASCADE_LABEL, reason=V.N_SMALL
        )
    if len(shown) == len(gaps) and all(quality_shows(g, margin) == BELOW_QUALITY for g in shown):
        why = (
            f"every speculative-cascade point ({len(shown)}) is below the target's quality: its paired 95% "
            f"interval of the quality difference lies under -{margin:.3g}"
        )
        return V.Verdict(named, False, why, n=n, label=CASCADE_LABEL)
    why = (
        "no speculative-cascade point is shown at the target's quality (non-inferior by its paired interval, "
        f"margin {margin:.3g}), nor is every one shown below it: these queries cannot tell"
    )
    return V.Verdict(named, None, why, n=n, label=CASCADE_LABEL, reason=V.INCONCLUSIVE)


def cascades_exhibit(run: CascadeRun) -> ExhibitSpec:
    return ExhibitSpec(run.run.dir, lambda root, pub, lay: cascades(root, pub, lay, run), (run.run,))


CPU_CASCADES = (  # quality label "": each task's column as its run's curves name it (quality_text)
    CascadeRun(CASCADES_GREEDY, "greedy", "quality", "", greedy=True),
    CascadeRun(CASCADES_SUMMARIZATION, "greedy, summarization", "quality", "", greedy=True),
    CascadeRun(CASCADES_SAMPLING, "temperature 1", "quality", ""),
)
PAPER_CASCADE_RUNS = tuple(
    CascadeRun(CASCADES_PAPER[name], title, "quality", f"{metric} (the task's metric)")
    for name, title, metric in (
        ("t5_wmt", "T5, WMT en->de", "corpus BLEU"),
        ("t5_xsum", "T5, XSum", "ROUGE-2 F x 100"),
        ("t5_cnndm", "T5, CNN/DM", "ROUGE-2 F x 100"),
        ("gemma_gsm8k", "Gemma-2 9B, GSM8K", "accuracy"),
        ("gemma27b_gsm8k", "Gemma-2 27B, GSM8K", "accuracy"),
    )
)
EXHIBITS = tuple(cascades_exhibit(run) for run in (*CPU_CASCADES, *PAPER_CASCADE_RUNS))
