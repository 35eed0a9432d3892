"""Speculative cascades: quality against speedup of each deferral rule, against plain SD (greedy) or lossy SD
(temperature sampling) at equal quality; and the Spec-Bench leaderboard's reference rows (paper scale)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from specbench.pipelines.tables import ALL_TASKS
from specbench.reproduction import verdicts as V
from specbench.reproduction.compare import faster_on, figure, fixed_methods, paired, short_name, timed, with_published
from specbench.reproduction.exhibit import CascadeRun, Exhibit, ExhibitSpec, Layout
from specbench.reproduction.published import Published
from specbench.reproduction.records import drafter_speeds, load_examples, run_table
from specbench.reproduction.runs import CASCADES_GREEDY, CASCADES_PAPER, CASCADES_SAMPLING, SPEC_BENCH_EVAL


SPEC_BENCH_ROWS = {"vicuna_68m": "SpS (vicuna-68m)", "prompt_lookup": "prompt lookup", "eagle": "EAGLE"}


def spec_bench_leaderboard(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    summary = run_table(root, f"{SPEC_BENCH_EVAL.dir}/summary.csv")
    ds = drafter_speeds(summary)
    tasks = [t for t in ds if t != ALL_TASKS]
    table = pd.DataFrame([{"method": SPEC_BENCH_ROWS.get(d, d), "speedup": v,
                           **{t: ds[t].get(d, math.nan) for t in tasks}} for d, v in ds.get(ALL_TASKS, {}).items()])
    table = with_published(table, published, "spec_bench", "leaderboard", {r: r for r in SPEC_BENCH_ROWS.values()},
                           ["speedup"])
    ex = load_examples(root, SPEC_BENCH_EVAL.dir)
    claim = "EAGLE is the fastest of the reference drafters, as on the leaderboard"
    verdict = (V.all_of(claim, [(f"vs {short_name(d)}", faster_on(ex, "", "fixed:eagle", d)) for d in fixed_methods(ex)
                                if d != "fixed:eagle"], "each part: speedup ratio EAGLE / that drafter > 1")
               if "fixed:eagle" in set(ex.method) else
               V.missing(claim, f"per-query records of EAGLE ({SPEC_BENCH_EVAL.dir}/examples.jsonl)", "speedup ratio"))
    return Exhibit("Spec-Bench reference rows: each drafter alone on question.jsonl",
                   table, [verdict],
                   "Speedup over autoregressive decoding on every question and turn of Spec-Bench's question.jsonl "
                   "(greedy, 1024 new tokens). Our drafters draft a chain of draft_length tokens; Spec-Bench's SpS uses "
                   "Hugging Face's adaptive assistant length and EAGLE a tree, so equal numbers are not expected.")


def cascade_points(curves: pd.DataFrame) -> pd.DataFrame:
    """One point per method over every task: mean speedup, mean agreement with the target (tokens), the
    task metric, and ROUGE-2 on summarization."""
    g = curves.groupby(["method", "rule", "alpha"], dropna=False)
    out = g.agg(speedup=("speedup", "mean"), agreement=("agreement_tokens", "mean"), quality=("quality", "mean")).reset_index()
    summ = curves[curves.task == "summarization"].set_index("method")
    out["rouge2_summarization"] = out.method.map(summ["quality"]) if len(summ) else math.nan
    return out


def cascades(root: Path, published: list[Published], lay: Layout, run: CascadeRun) -> Exhibit:
    curves = run_table(root, f"{run.run.dir}/curves.csv")
    pts = cascade_points(curves)
    quality = run.quality

    def plot(path: Path) -> None:
        def draw(ax):
            rules = pts[~pts.method.isin(["autoregressive", "sd", "drafter_alone"])]
            for rule, sub in rules.groupby("rule"):
                sub = sub.sort_values("alpha")
                ax.plot(sub.speedup, sub[quality], marker="o", label=rule)
            for m, style in (("sd", "k*"), ("drafter_alone", "kx")):
                sub = pts[pts.method == m]
                if len(sub):
                    ax.plot(sub.speedup, sub[quality], style, markersize=10, label=m)
        figure(path, draw, f"Speculative cascades ({lay.scale}, {run.name}): quality vs speed",
                "speedup over autoregressive (mean over tasks)", run.quality_label, size=(6.5, 4))

    notes = f"Quality axis (the verdict and the figure): {run.quality_label}. Plain SD is lossless."
    if run.greedy:
        notes += (" Under greedy decoding lossy SD is plain SD for alpha < 1 and the drafter alone at alpha 1, so those "
                  "two rows are its points.")
    notes += (" Verdicts: paired per query (each rule point against each baseline point on the same queries), "
              "faster with the speedup ratio's interval above 1 and at equal quality, i.e. the interval of the mean "
              "per-query quality difference above minus the stated margin; the level of each pair is "
              "Bonferroni-corrected over the pairs picked from.")
    return Exhibit(f"Speculative cascades, quality against speedup ({run.title})",
                   pts, cascade_verdicts(load_examples(root, run.run.dir), run), notes, plot=plot)


CASCADE_MARGINS = {"agreement": 0.05, "rouge2_summarization": 1.0}


SEQUENTIAL = ("the runs hold no sequential cascade (whole-query deferral from the drafter to the target): "
              "`specbench cascades` runs autoregressive decoding, the drafter alone, plain SD and the token-level rules")


def cascade_quality(ex: pd.DataFrame, run: CascadeRun) -> tuple[pd.Series | None, float, str]:
    """(per-record quality on ``run``'s axis, indexed like ``ex``; its equal-quality margin; why None)."""
    from specbench.arms import AUTOREGRESSIVE
    from specbench.pipelines.cascades import QUALITY, agreement

    if run.quality == "agreement":
        ar = ex[ex.method == AUTOREGRESSIVE].set_index("query_id").output_ids
        q = [agreement(o, ar[qid])["tokens"] if qid in ar.index and isinstance(o, list) else math.nan
             for qid, o in zip(ex.query_id, ex.output_ids)]
        return pd.Series(q, index=ex.index, dtype=float), CASCADE_MARGINS["agreement"], ""
    tasks = ["summarization"] if run.quality == "rouge2_summarization" else sorted(set(ex.task) & set(QUALITY))
    if len(tasks) != 1:
        return None, math.nan, (f"the tasks {', '.join(tasks)} have different quality metrics, which cannot be pooled"
                                if tasks else "no task with a quality metric")
    key, tolerance = QUALITY[tasks[0]]
    q = [(qd or {}).get(key) if t == tasks[0] and isinstance(qd, dict) else None for t, qd in zip(ex.task, ex.quality)]
    margin = CASCADE_MARGINS.get(run.quality, tolerance)
    return pd.Series([math.nan if v is None else float(v) for v in q], index=ex.index, dtype=float), margin, ""


def cascade_verdicts(ex: pd.DataFrame, run: CascadeRun) -> list[V.Verdict]:
    """Greedy: a deferral rule against plain SD at equal quality, and (not judged) against the sequential
    cascade. Temperature sampling: a deferral rule against lossy SD at equal quality. Each rule point against
    each baseline point, paired per query, at a Bonferroni-corrected level over those pairs."""
    from specbench.pipelines.cascades import SD

    base_name = "plain SD" if run.greedy else "lossy SD"
    claim = f"a deferral rule is faster than {base_name} at equal quality"
    out = []
    label = f"speedup ratio rule / {base_name}"
    if ex.empty:
        out.append(V.missing(claim, f"per-query records ({run.run.dir}/examples.jsonl)", label))
    else:
        quality, margin, why = cascade_quality(ex, run)
        rules = [m for m in dict.fromkeys(ex.method) if "@" in str(m) and not str(m).startswith("lossy_sd@")]
        bases = [SD] if run.greedy else [m for m in dict.fromkeys(ex.method) if str(m).startswith("lossy_sd@")]
        if quality is None:
            out.append(V.unpaired(claim, why, label))
        elif not rules or not bases or not set(bases) <= set(ex.method):
            out.append(V.missing(claim, f"per-query records of a deferral rule or of {base_name}", label))
        else:
            ex = ex.assign(_q=quality)[quality.notna()]
            level = V.bonferroni(len(rules) * len(bases))
            parts = []
            for b in bases:
                for r in rules:
                    p = paired(ex, [r, b])
                    speed = V.faster("", timed(p[r]), timed(p[b]), (r, b), level=level)
                    equal = V.greater_mean("", list(p[r]._q), list(p[b]._q), f"quality difference {r} - {b}",
                                           threshold=-margin, level=level)
                    parts.append((f"{r} vs {b}", V.all_of("", [("faster", speed), ("equal quality", equal)])))
            out.append(V.any_of(claim, parts,
                                f"{run.quality_label.split(' (')[0]}; equal-quality margin {margin:g} (stated); "
                                f"{len(parts)} pairs, each at level {level:.2%} (Bonferroni)"))
    if run.greedy:
        out.append(V.unpaired("a deferral rule is faster than the sequential cascade at equal quality", SEQUENTIAL,
                              "speedup ratio rule / sequential cascade"))
    return out


LEADERBOARD = ExhibitSpec("spec_bench/leaderboard", spec_bench_leaderboard, (SPEC_BENCH_EVAL,), ("spec_bench/leaderboard",))


def cascades_exhibit(run: CascadeRun) -> ExhibitSpec:
    return ExhibitSpec(run.run.dir, lambda root, pub, lay: cascades(root, pub, lay, run), (run.run,))


CPU_CASCADES = (
    CascadeRun(CASCADES_GREEDY, "greedy", "agreement",
               "agreement with the target's output (mean share of token positions equal to the autoregressive output)",
               greedy=True),
    CascadeRun(CASCADES_SAMPLING, "temperature 1", "rouge2_summarization",
               "ROUGE-2 on summarization (at temperature 1 two samples disagree whatever the rule, and the 135M target "
               "scores near zero on BLEU and GSM8K, so those cannot separate rules)"),
)
PAPER_CASCADE_RUNS = tuple(CascadeRun(CASCADES_PAPER[name], title, "quality", f"{metric} (the task's metric)")
                           for name, title, metric in (
    ("t5_wmt", "T5, WMT en->de", "corpus BLEU"), ("t5_xsum", "T5, XSum", "ROUGE-2 F x 100"),
    ("t5_cnndm", "T5, CNN/DM", "ROUGE-2 F x 100"), ("gemma_gsm8k", "Gemma-2 9B, GSM8K", "accuracy"),
    ("gemma27b_gsm8k", "Gemma-2 27B, GSM8K", "accuracy")))
EXHIBITS = tuple(cascades_exhibit(run) for run in (*CPU_CASCADES, *PAPER_CASCADE_RUNS))
