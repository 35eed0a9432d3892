"""``specbench cascades``: quality against speed for speculative-cascade rules as the lenience varies.

The target, its pool and the dataset are loaded once (``evaluate.prepare``). Per query, in one
process with one clock: the autoregressive baseline first (every other method's agreement is
measured against its output), then, in an order rotated by the query index, the chosen drafter
alone (its own greedy generation: the decode loop with the drafter's module as the target and the
autoregressive arm), lossless speculative decoding with that drafter (``sd``: rule ``none``,
alpha = 0) and every ``<rule>@<alpha>`` of the grid with the same drafter. Records are appended as
each generation finishes (``examples.jsonl``, ``rounds.jsonl``); rerunning into the same directory
skips finished (query, method) pairs. ``curves.csv`` / ``curves.md`` and one ``curves_<task>.png``
per task are pure functions of those records (:func:`curves`, :func:`best_at_loss`, :func:`plot`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from specbench.decoding.cascade import RULES, Cascade
from specbench.decoding.loop import Generation, Limits, decode
from specbench.drafters import AUTOREGRESSIVE, AutoregressiveArm, ModelDrafter
from specbench.errors import SpecbenchError
from specbench.pipelines import report
from specbench.pipelines.evaluate import _seed_for, alone_target, eos_ids_of, example_record, prepare, start_run
from specbench.records import JsonlWriter, read_jsonl, round_row
from specbench.selection import Fixed
from specbench.timing import Clock

log = logging.getLogger(__name__)

SD = "sd"
ALONE = "drafter_alone"
# quality column per task and the loss the closing note tolerates against lossless SD
QUALITY = {"translation": ("bleu", 1.0), "summarization": ("rouge2", 1.0), "math": ("accuracy", 0.01)}
COLUMNS = ["task", "method", "rule", "alpha", "n_examples", "metric", "quality", "speedup", "speedup_mean",
           "rejection_rate", "mat", "acceptance_rate", "deferral_rate", "agreement_exact", "agreement_tokens",
           "new_tokens", "seconds"]
NOTES = ("One row per (task, method). quality: corpus BLEU (translation), mean ROUGE-2 F x 100 (summarization), "
         "GSM8K accuracy (math). speedup = total autoregressive seconds / total method seconds on the same "
         "examples (speedup_mean: mean of per-example ratios). rejection_rate = draft tokens the verifier rejected "
         "/ draft tokens it judged (accepted + rejected; tokens after a rejection are not judged): the paper's "
         "cost proxy. mat = new tokens per target forward (bonus token included). acceptance_rate = accepted / "
         "drafted. deferral_rate = deferred / drafted positions (sd: 1 by definition). agreement_exact = share of "
         "outputs equal to the autoregressive output; agreement_tokens = mean share of positions where they agree. "
         "drafter_alone: the drafter's own greedy generation (no target).")


@dataclass(frozen=True)
class Variant:
    name: str
    cascade: Cascade | None  # None: autoregressive or drafter alone


def variants(rules, alphas) -> list[Variant]:
    """autoregressive, drafter alone, lossless SD, then every (rule, alpha) of the grid, validated now."""
    out = [Variant(AUTOREGRESSIVE, None), Variant(ALONE, None), Variant(SD, Cascade("none", 0.0))]
    for rule in rules or []:
        rule = str(rule)
        if rule not in RULES or rule == "none":
            raise SpecbenchError(f"unknown cascade rule '{rule}' in rules",
                                 f"use rules from: {', '.join(r for r in RULES if r != 'none')}")
        if rule not in (alphas or {}):
            raise SpecbenchError(f"rule '{rule}' has no alphas", f"set alphas.{rule}=[...]")
        for a in alphas[rule]:
            c = Cascade(rule, float(a))
            if c.label not in {v.name for v in out}:
                out.append(Variant(c.label, c))
    return out


def agreement(output: list[int], reference: list[int]) -> dict:
    """exact: identical ids; tokens: share of positions (over the longer length) with the same id."""
    n = max(len(output), len(reference))
    same = sum(a == b for a, b in zip(output, reference))
    return {"exact": list(output) == list(reference), "tokens": same / n if n else 1.0}


def rejections(rounds: Iterable[dict]) -> int:
    """Rounds whose draft the verifier cut short: fewer accepted than drafted and one target token emitted
    after the accepted prefix (a draft cut by an EOS inside its accepted prefix is not a rejection)."""
    return sum(1 for r in rounds if r["accepted"] < r["drafted"] and r["emitted"] == r["accepted"] + 1)


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    out = start_run(cfg, output_dir)
    sampling, limits, queries, loaded, target, pool, prompter = prepare(cfg)
    tasks = cfg.get("tasks")
    if tasks:
        queries = [q for q in queries if q.task in set(tasks)]
        if not queries:
            raise SpecbenchError(f"no queries of tasks {list(tasks)} in the dataset",
                                 "check `tasks` against the dataset's sources (translation, summarization, math, chat)")
    name = str(cfg.drafter_arm)
    if name not in pool or name == AUTOREGRESSIVE:
        raise SpecbenchError(f"drafter '{name}' is not in the pool",
                             f"set drafter_arm to one of: {', '.join(a for a in pool if a != AUTOREGRESSIVE)}")
    drafter = pool[name]
    runs = variants(cfg.rules, cfg.alphas)
    if not isinstance(drafter, ModelDrafter):
        log.warning("drafter %s has no model of its own: the drafter-alone row is skipped", name)
        runs = [v for v in runs if v.name != ALONE]
    eos_ids = eos_ids_of(loaded, cfg.decoding.get("extra_eos_ids"))
    clock = Clock(target.device)
    arms = {AUTOREGRESSIVE: AutoregressiveArm()}
    spec_pool = {AUTOREGRESSIVE: pool[AUTOREGRESSIVE], name: drafter}
    alone = alone_target(drafter, target) if isinstance(drafter, ModelDrafter) else None

    def generate(v: Variant, prompt: list[int], lim: Limits, rng: torch.Generator, query) -> Generation:
        if v.name == ALONE:
            return decode(alone, arms, Fixed([AUTOREGRESSIVE], AUTOREGRESSIVE), prompt, sampling=sampling,
                          limits=lim, eos_ids=eos_ids, rng=rng, clock=clock, query=query)
        arm = AUTOREGRESSIVE if v.name == AUTOREGRESSIVE else name
        return decode(target, spec_pool, Fixed(list(spec_pool), arm), prompt, sampling=sampling, limits=lim,
                      eos_ids=eos_ids, rng=rng, clock=clock, query=query, cascade=v.cascade)

    previous = list(read_jsonl(out / "examples.jsonl"))
    done = {(r["query_id"], r["method"]) for r in previous}
    ar_ids = {r["query_id"]: r["output_ids"] for r in previous if r["method"] == AUTOREGRESSIVE}
    if done:
        log.info("resuming: %d finished generations found in %s", len(done), out)
    todo = [(q, v) for q in queries for v in runs if (q.id, v.name) not in done]

    if todo and cfg.warmup.max_new_tokens > 0:
        warm = Limits(max_new_tokens=int(cfg.warmup.max_new_tokens), draft_length=limits.draft_length)
        for v in runs:
            generate(v, prompter(queries[0]), warm, torch.Generator(device=target.device).manual_seed(0), queries[0])

    todo_set = {(q.id, v.name) for q, v in todo}
    with JsonlWriter(out / "rounds.jsonl") as rounds_out, JsonlWriter(out / "examples.jsonl") as examples_out, \
            tqdm(total=len(todo), desc="cascades", unit="query x method") as bar:
        for qi, query in enumerate(queries):
            prompt = prompter(query)
            rest = runs[1:]
            order = [runs[0]] + [rest[(qi + j) % len(rest)] for j in range(len(rest))]
            for v in order:
                if (query.id, v.name) not in todo_set:
                    continue
                mi = [r.name for r in runs].index(v.name)
                rng = torch.Generator(device=target.device).manual_seed(_seed_for(int(cfg.seed), qi, mi))
                gen = generate(v, prompt, limits, rng, query)
                text = loaded.tokenizer.decode(gen.tokens, skip_special_tokens=True)
                if v.name == AUTOREGRESSIVE:
                    ar_ids[query.id] = gen.tokens
                agree = agreement(gen.tokens, ar_ids[query.id]) if query.id in ar_ids else {}
                rounds_out.write_many(round_row(query.id, query.task, v.name, r) for r in gen.rounds)
                examples_out.write(example_record(query, query.id, v.name, gen, text, query.reference, agreement=agree))
                bar.update(1)

    examples = list(read_jsonl(out / "examples.jsonl"))
    table = curves(examples, read_jsonl(out / "rounds.jsonl"))
    best = best_at_loss(table)
    title = f"specbench cascades: {cfg.target.model}, drafter {name}"
    report.write_tables(table, out, stem="curves", title=title, notes=NOTES + "\n\n" + closing_note(best))
    best.to_csv(out / "best.csv", index=False)
    try:
        for task in table.task.unique():
            if task not in QUALITY:
                continue
            plot(table[table.task == task], out / f"curves_{task}.png", title=f"{task}: {cfg.target.model}, {name}")
    except ImportError:
        log.warning("matplotlib is not installed: curves_<task>.png skipped (pip install matplotlib)")
    shown = ["task", "method", "quality", "speedup", "rejection_rate", "mat", "agreement_exact"]
    report.print_table(report.to_markdown(table[shown]), title=f"curves ({out}; every column in curves.csv)")
    report.print_table(closing_note(best), title="best rule per task")
    return out


# ------------------------------------------------------------------ tables and figures (pure functions)


def parse_method(method: str) -> tuple[str, float]:
    """``chow@0.3`` -> (chow, 0.3); ``sd`` -> (none, 0); autoregressive / drafter_alone -> (method, nan)."""
    if method == SD:
        return "none", 0.0
    if "@" in method:
        rule, alpha = method.split("@", 1)
        return rule, float(alpha)
    return method, float("nan")


def curves(examples: Iterable[dict], rounds: Iterable[dict]) -> pd.DataFrame:
    """One row per (task, method): quality, speedup over autoregressive, rejection rate, MAT, agreement."""
    df = pd.DataFrame(list(examples))
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    rj = pd.DataFrame(list(rounds))
    if rj.empty:
        rej = {}
    else:
        rej = {key: rejections(g.to_dict("records")) for key, g in rj.groupby(["query_id", "method"])}
    df["rejected"] = [rej.get((q, m), 0) for q, m in zip(df.query_id, df.method)]
    if "deferred" not in df:
        df["deferred"] = 0
    base = df[df.method == AUTOREGRESSIVE].set_index("query_id")
    rows = []
    for task, sub in df.groupby("task"):
        key = QUALITY.get(task, (None, 0.0))[0]
        for method, m in sub.groupby("method", sort=False):
            rule, alpha = parse_method(method)
            paired = m[m.query_id.isin(base.index)]
            b = base.loc[paired.query_id]
            judged = int(m.accepted.sum() + m.rejected.sum())
            drafted = int(m.drafted.sum())
            agree = [a for a in m.get("agreement", pd.Series(dtype=object)) if isinstance(a, dict) and a]
            rows.append({
                "task": task, "method": method, "rule": rule, "alpha": alpha, "n_examples": len(m),
                "metric": key or "", "quality": report._quality(m, key) if key else float("nan"),
                "speedup": float(b.seconds.sum()) / float(paired.seconds.sum()) if len(paired) else float("nan"),
                "speedup_mean": float((b.seconds.values / paired.seconds.values).mean()) if len(paired) else float("nan"),
                "rejection_rate": int(m.rejected.sum()) / judged if judged else float("nan"),
                "mat": int(m.new_tokens.sum()) / int(m.target_calls.sum()) if int(m.target_calls.sum()) and method != ALONE
                else float("nan"),
                "acceptance_rate": int(m.accepted.sum()) / drafted if drafted else float("nan"),
                "deferral_rate": int(m.deferred.sum()) / drafted if drafted else float("nan"),
                "agreement_exact": sum(bool(a["exact"]) for a in agree) / len(agree) if agree else float("nan"),
                "agreement_tokens": sum(a["tokens"] for a in agree) / len(agree) if agree else float("nan"),
                "new_tokens": int(m.new_tokens.sum()), "seconds": float(m.seconds.sum()),
            })
    out = pd.DataFrame(rows, columns=COLUMNS)
    first = {AUTOREGRESSIVE: 0, ALONE: 1, SD: 2}
    out["_o"] = out.method.map(lambda x: first.get(x, 3))
    out["_r"] = out.rule.map(lambda r: RULES.index(r) if r in RULES else -1)
    return out.sort_values(["task", "_o", "_r", "alpha"]).drop(columns=["_o", "_r"]).reset_index(drop=True)


def best_at_loss(table: pd.DataFrame) -> pd.DataFrame:
    """Per task and rule, the fastest alpha whose quality is within the task's tolerance of lossless SD
    (1 BLEU / ROUGE-2 point, 0.01 accuracy); then the best rule per task first.

    Columns: task, rule, alpha, quality, sd_quality, speedup, sd_speedup, gain (speedup / sd_speedup).
    """
    rows = []
    for task, sub in table.groupby("task"):
        if task not in QUALITY or (sub.method == SD).sum() == 0:
            continue
        tol = QUALITY[task][1]
        sd = sub[sub.method == SD].iloc[0]
        cands = sub[sub.method.str.contains("@") & (sub.quality >= sd.quality - tol - 1e-9)]
        for rule, r in cands.groupby("rule"):
            top = r.loc[r.speedup.idxmax()]
            rows.append({"task": task, "rule": rule, "alpha": top.alpha, "quality": top.quality,
                         "sd_quality": sd.quality, "speedup": top.speedup, "sd_speedup": sd.speedup,
                         "gain": top.speedup / sd.speedup})
    cols = ["task", "rule", "alpha", "quality", "sd_quality", "speedup", "sd_speedup", "gain"]
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["task", "speedup"], ascending=[True, False]).reset_index(drop=True)


def closing_note(best: pd.DataFrame) -> str:
    """One line per task: the best rule's speedup at a quality loss within tolerance of lossless SD."""
    if best.empty:
        return "No rule stayed within the quality tolerance of lossless SD (or no task has a quality metric)."
    lines = []
    for task, sub in best.groupby("task", sort=False):
        b = sub.iloc[0]
        metric, tol = QUALITY[task]
        loss = f"{tol:g} point" if metric != "accuracy" else f"{tol * 100:g}% accuracy"
        lines.append(f"- {task}: best rule {b.rule} (alpha {b.alpha:g}): speedup {b.speedup:.3f}x over "
                     f"autoregressive vs {b.sd_speedup:.3f}x for lossless SD ({b.gain:.3f}x SD's), {metric} "
                     f"{b.quality:.2f} vs SD {b.sd_quality:.2f} (tolerance: {loss}).")
    return "\n".join(lines)


def plot(table: pd.DataFrame, path: Path, title: str = "") -> None:
    """Quality against speedup for one task: each rule a line over alpha, SD and the drafter alone marked."""
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sd = table[table.method == SD]
    for rule, sub in table[table.method.str.contains("@")].groupby("rule", sort=False):
        sub = pd.concat([sd, sub]).sort_values("alpha")  # every curve starts at lossless SD
        ax.plot(sub.speedup, sub.quality, marker="o", ms=4, label=rule)
    for method, marker, label in [(SD, "*", "SD (alpha = 0, lossless)"), (ALONE, "X", "drafter alone"),
                                  (AUTOREGRESSIVE, "s", "autoregressive")]:
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


__all__ = ["ALONE", "SD", "agreement", "alone_target", "best_at_loss", "closing_note", "curves", "plot",
           "rejections", "run", "variants"]
