"""``specbench cascades``: quality against speed for speculative-cascade rules as the lenience varies.

The target, its pool and the dataset are loaded once (``Session``). Per query, in one process with
one clock and in an order rotated by the query index (as in ``eval``): the autoregressive baseline,
the chosen drafter alone (its own greedy generation: the decode loop with the drafter's module as
the target and the autoregressive arm), lossless speculative decoding with that drafter (``sd``:
rule ``none``, alpha = 0) and every ``<rule>@<alpha>`` of the grid with the same drafter. Agreement
with the autoregressive output is computed from the records, after the fact. Records are appended as
each generation finishes (``examples.jsonl``, ``rounds.jsonl``); rerunning into the same directory
skips finished (query, method) pairs. ``curves.csv`` / ``curves.md`` and one ``curves_<task>.png``
per task are pure functions of those records (``cascade_curves.py``: ``curves``, ``best_at_loss``, ``plot``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from omegaconf import DictConfig
from tqdm.auto import tqdm

from specbench.arms import AUTOREGRESSIVE
from specbench.decoding.cascade import RULES, Cascade
from specbench.decoding.loop import Generation, Limits
from specbench.errors import SpecbenchError
from specbench.pipelines import tables
from specbench.pipelines.cascade_curves import (
    ALONE,
    QUALITY,
    SD,
    best_at_loss,
    closing_note,
    curves,
    notes,
    plot,
)
from specbench.pipelines.session.core import Session
from specbench.pipelines.session.run_dir import RECORDS
from specbench.pipelines.session.run_records import Records, write_after_stop
from specbench.pipelines.session.schedule import rotation
from specbench.records import BEST_CSV, CURVES
from specbench.tasks.registry import quality_columns

log = logging.getLogger(__name__)


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
            raise SpecbenchError(
                f"unknown cascade rule '{rule}' in rules",
                f"use rules from: {', '.join(r for r in RULES if r != 'none')}",
            )
        if rule not in (alphas or {}):
            raise SpecbenchError(f"rule '{rule}' has no alphas", f"set alphas.{rule}=[...]")
        for a in alphas[rule]:
            c = Cascade(rule, float(a))
            if c.label not in {v.name for v in out}:
                out.append(Variant(c.label, c))
    return out


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    s = Session.open(cfg, output_dir, RECORDS, "cascades")
    queries = of_tasks(s.queries, cfg.get("tasks"))
    name = str(cfg.drafter_arm)
    if name not in s.pool or name == AUTOREGRESSIVE:
        raise SpecbenchError(
            f"drafter '{name}' is not in the pool",
            f"set drafter_arm to one of: {', '.join(a for a in s.pool if a != AUTOREGRESSIVE)}",
        )
    drafter = s.pool[name]
    runs = variants(cfg.rules, cfg.alphas)
    quality = quality_columns(cfg.get("quality_metric"))
    if not drafter.can_generate_alone:
        log.warning("drafter %s has no model of its own: the drafter-alone row is skipped", name)
        runs = [v for v in runs if v.name != ALONE]
    spec_pool = {AUTOREGRESSIVE: s.pool[AUTOREGRESSIVE], name: drafter}
    alone = s.alone(name) if drafter.can_generate_alone else None

    def generate(v: Variant, prompt: list[int], lim: Limits, rng, query=None) -> Generation:
        if v.name == ALONE:
            return alone(prompt, rng, lim)
        arm = AUTOREGRESSIVE if v.name == AUTOREGRESSIVE else name
        return s.decode(
            s.fixed(arm, spec_pool),
            prompt,
            rng,
            replace(s.spec, limits=lim, cascade=v.cascade),
            query=query,
            pool=spec_pool,
        )

    records = s.records(queries)
    todo = {(q.id, v.name) for q in queries for v in runs} - records.done
    if todo:
        s.warm_up(lambda prompt, lim, rng, v=v: generate(v, prompt, lim, rng) for v in runs)

    try:
        with records, tqdm(total=len(todo), desc="cascades", unit="query x method") as bar:
            for qi, query in enumerate(queries):
                prompt = s.prompter(query)
                for mi in rotation(len(runs), qi):
                    v = runs[mi]
                    if (query.id, v.name) not in todo:
                        continue
                    gen = generate(v, prompt, s.limits, s.rng(qi, mi), query)
                    records.write(query, query.id, v.name, gen, s.text(gen.tokens), query.reference)
                    bar.update(1)
    except BaseException:
        model = f"{cfg.target.model} in {cfg.target.dtype}"
        write_after_stop(
            records,
            s.out,
            "cascades",
            "curves",
            lambda: write_curves(records, s.out, model, name, quality, stopped=True),
        )
        raise
    write_curves(records, s.out, f"{cfg.target.model} in {cfg.target.dtype}", name, quality)
    return s.out


def of_tasks(queries: list, tasks) -> list:
    """The queries of ``tasks`` (all when None), refused when none is left."""
    if not tasks:
        return queries
    chosen = [q for q in queries if q.task in set(tasks)]
    if not chosen:
        raise SpecbenchError(
            f"no queries of tasks {list(tasks)} in the dataset",
            "check `tasks` against the dataset's sources (translation, summarization, math, chat)",
        )
    return chosen


def write_curves(
    records: Records,
    out: Path,
    model: str,
    name: str,
    quality: dict[str, tuple[str, float]] = QUALITY,
    stopped: bool = False,
) -> None:
    """curves.csv/md, best.csv and the per-task plots from the run's records (``quality``: each task's quality
    column, ``quality_columns``; ``stopped``: a partial run)."""
    table = curves(records.examples(), records.rounds(), quality)
    best = best_at_loss(table)
    title = f"specbench cascades: {model}, drafter {name}" + (
        " (stopped early: the finished generations only)" if stopped else ""
    )
    tables.write_tables(
        table,
        out,
        stem=CURVES,
        title=title,
        notes=notes(quality) + "\n\n" + closing_note(best, table) + tables.pairing_note(table),
    )
    tables.write_csv(best, out / BEST_CSV)
    try:
        for task in table.task.unique():
            if task not in QUALITY:
                continue
            plot(table[table.task == task], out / f"curves_{task}.png", title=f"{task}: {model}, {name}")
    except ImportError:
        log.warning("matplotlib is not installed: curves_<task>.png skipped (pip install matplotlib)")
    shown = ["task", "method", "quality", "speedup", "rejection_rate", "mat", "agreement_exact"]
    tables.print_table(tables.to_markdown(table[shown]), title=f"curves ({out}; every column in curves.csv)")
    tables.print_table(closing_note(best, table), title="best rule per task")


# ------------------------------------------------------------------ tables and figures (pure functions)


__all__ = ["run", "variants", "write_curves"]
