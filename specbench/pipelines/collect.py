"""``specbench collect``: offline rewards for the context-aware drafter policy.

Per query (one row, appended as soon as it is finished):
- the query's embedding from the target (``Target.embed``: mean/last pooling) and its content
  ``fingerprint`` (a policy trained on these rows refuses to be evaluated on the same queries);
- the target's greedy output (the autoregressive run of the one decode loop, timed);
- each drafter's own greedy output, generated alone, timed, and its ``alignment`` with the
  target's output (ROUGE-L F by default; ``collect.alignment``); a drafter that cannot generate
  alone (prompt lookup) is marked ``standalone: false`` with no alignment;
- each arm's cost: ``cost_params`` (parameter/weight bytes relative to the target; the
  autoregressive arm is the target, 1.0) and ``cost_measured`` (seconds per token alone relative
  to the target's);
- with ``collect.measure_speculative``: a real speculative run per arm (``spec``: seconds, target
  calls, drafted and accepted tokens, MAT, speedup over the autoregressive run of the same query,
  exact match); ``train-policy reward.alignment=acceptance`` scores arms by accepted / drafted;
- with ``collect.trace=<a specbench trace run of the same queries>``: nothing is decoded but the prompt's
  embedding; the autoregressive and speculative runs are replayed from the trace (``traced.py``: exact arms and
  acceptance, predicted times, ``spec.replayed``), and no standalone output is collected.

Raw scores are kept (not a combined reward), so ``train-policy`` can change alpha, the cost kind
and the arm set without collecting again. A rerun into the same directory skips finished queries
(its settings must match the directory's ``collect_config.yaml``, else it is refused unless
``collect.overwrite``); ``collect.shard=i collect.num_shards=n`` takes every n-th query into
``rows-<i>-of-<n>.jsonl``, and ``specbench merge`` joins shard files (``collected.py``: ``read_rows`` reads
every ``rows*.jsonl`` of a directory; a query id in two directories is refused, not dropped).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

from omegaconf import DictConfig
from tqdm.auto import tqdm

from specbench.arms import AUTOREGRESSIVE
from specbench.decoding.loop import Generation, Limits
from specbench.errors import SpecbenchError
from specbench.pipelines import speed
from specbench.pipelines.collected import SIGNATURE_FILE, read_rows, rows_file, write_plan
from specbench.pipelines.session.core import Session
from specbench.pipelines.session.run_dir import RunFiles
from specbench.pipelines.session.schedule import rotation
from specbench.pipelines.traced import TracedRuns
from specbench.records import JsonlWriter, read_jsonl
from specbench.tasks import metrics
from specbench.validate import COUNT, boolean, integer, text


@dataclass(frozen=True, kw_only=True)
class CollectSettings:
    """collect.* (conf/collect.yaml holds the defaults)."""

    max_new_tokens: Annotated[int | None, integer(1, null=True, note=" (null: decoding.max_new_tokens)")]
    alignment: Annotated[str, text()]  # a name of ALIGNMENTS
    measure_speculative: Annotated[bool, boolean()]
    trace: Annotated[str | None, text(null=True)]
    shard: Annotated[int, integer(0)]
    num_shards: Annotated[int, COUNT]
    overwrite: Annotated[bool, boolean()]


@dataclass(frozen=True, kw_only=True)
class Embedding:
    """embedding.*: how a query's embedding is pooled (Target.embed's: mean | last)."""

    pooling: Annotated[str, text()]


SECTIONS: dict[str, tuple[type, ...]] = {"collect": (CollectSettings,), "embedding": (Embedding,)}

log = logging.getLogger(__name__)

ALIGNMENTS = ("rougeL", "rouge1", "rouge2", "bleu")
# A collection's settings (``collect_config.yaml``): every setting but those that do not change the
# rows (session.NOT_COMPARED: threads, warm-up, overwrite, the shard a process takes).
RUN_FILES = RunFiles(results=("rows*.jsonl",), settings=SIGNATURE_FILE, overwrite="collect.overwrite")


def alignment(metric: str, drafter_text: str, target_text: str) -> float:
    """How well a drafter's own output matches the target's, in [0, 1]."""
    if metric == "bleu":
        return metrics.bleu(drafter_text, target_text) / 100.0
    if metric in ("rougeL", "rouge1", "rouge2"):
        return metrics.rouge(drafter_text, target_text)[metric] / 100.0
    raise SpecbenchError(
        f"unknown alignment metric '{metric}'", f"set collect.alignment to one of: {', '.join(ALIGNMENTS)}"
    )


def spec_summary(gen: Generation, ar: Generation, replayed: bool = False) -> dict:
    """An arm's speculative run of a query against the autoregressive one (``replayed``: from a trace, its times
    predicted)."""
    return {
        **({"replayed": True} if replayed else {}),
        "seconds": gen.seconds,
        "target_calls": gen.target_calls,
        "new_tokens": len(gen.tokens),
        "drafted": gen.drafted,
        "accepted": gen.accepted,
        "mat": speed.mat(len(gen.tokens), max(gen.target_calls, 1)),
        "speedup": ar.seconds / gen.seconds if gen.seconds else None,
        "exact_match": gen.tokens == ar.tokens,
    }


def check_options(col: DictConfig) -> None:
    shard, num_shards = int(col.shard), int(col.num_shards)
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise SpecbenchError(
            f"collect.shard={shard} collect.num_shards={num_shards} is not a valid shard",
            "use 0 <= collect.shard < collect.num_shards",
        )
    if col.alignment not in ALIGNMENTS:
        raise SpecbenchError(
            f"unknown alignment metric '{col.alignment}'",
            f"set collect.alignment to one of: {', '.join(ALIGNMENTS)}",
        )


class Collector:
    """One query's generations and its row: the target's greedy run, each drafter alone (its module as the target
    of the one decode loop, autoregressive arm) and, measured, each arm's speculative run; or all of them replayed
    from a trace (``traced``)."""

    def __init__(self, s: Session, limits: Limits, traced: TracedRuns | None):
        col = s.cfg.collect
        self.s, self.col, self.limits, self.traced = s, col, limits, traced
        self.arms = list(s.pool)
        self.drafters = [a for a in self.arms if a != AUTOREGRESSIVE]
        self.measured = bool(col.measure_speculative) or traced is not None
        self.alone = {a: s.alone(a) for a in self.drafters if s.pool[a].can_generate_alone and traced is None}
        self.fingerprints = s.drafter_fingerprints()

    def speculative(
        self, arm: str, prompt_ids: list[int], seed: int, limits: Limits | None = None
    ) -> Generation:
        s = self.s
        return s.decode(
            s.fixed(arm), prompt_ids, s.rng(seed=seed), replace(s.spec, limits=limits or self.limits)
        )

    def warm_up(self) -> None:
        if self.traced is None:
            self.s.warm_up(
                lambda prompt, lim, rng, a=a: self.speculative(a, prompt, 0, lim) for a in self.arms
            )

    def generations(self, query, index: int, prompt_ids: list[int], seed: int):
        """``(speculative runs by arm, the autoregressive one included; drafters' own runs by arm)``: every
        timed generation, rotated like eval (none when replayed from a trace)."""
        if self.traced is not None:
            return self.traced.generations(query, prompt_ids), {}
        spec: dict[str, Generation] = {}
        own: dict[str, Generation] = {}
        for arm in (self.arms[ai] for ai in rotation(len(self.arms), index)):
            if arm == AUTOREGRESSIVE:
                spec[arm] = self.speculative(arm, prompt_ids, seed)
                continue
            if arm in self.alone:
                own[arm] = self.alone[arm](prompt_ids, self.s.rng(seed=seed), self.limits)
            if self.col.measure_speculative:
                spec[arm] = self.speculative(arm, prompt_ids, seed)
        return spec, own

    def row(self, index: int, query) -> dict:
        s, replayed = self.s, self.traced is not None
        prompt_ids = s.prompter(query)
        seed = int(s.cfg.seed) * 1_000_003 + index
        embedding = s.target.embed(prompt_ids, str(s.cfg.embedding.pooling))
        spec, own = self.generations(query, index, prompt_ids, seed)
        ar = spec[AUTOREGRESSIVE]
        target_text = s.text(ar.tokens)
        target_spt = ar.seconds / max(len(ar.tokens), 1)
        arms: dict[str, dict] = {
            AUTOREGRESSIVE: {
                "standalone": True,
                "alignment": 1.0,
                "cost_params": 1.0,
                "cost_measured": 1.0,
                "seconds": ar.seconds,
                "new_tokens": len(ar.tokens),
                **({"spec": spec_summary(ar, ar, replayed)} if self.measured else {}),
            }
        }
        for arm in self.drafters:
            rec: dict = {"standalone": arm in self.alone, "cost_params": float(s.pool[arm].cost)}
            if arm in own:
                text = s.text(own[arm].tokens)
                rec.update(
                    text=text,
                    new_tokens=len(own[arm].tokens),
                    seconds=own[arm].seconds,
                    alignment=alignment(str(self.col.alignment), text, target_text),
                    cost_measured=(own[arm].seconds / max(len(own[arm].tokens), 1)) / target_spt
                    if target_spt
                    else None,
                )
            else:
                rec.update(alignment=None, cost_measured=None)
            if self.measured:
                rec["spec"] = spec_summary(spec[arm], ar, replayed)
            arms[arm] = rec
        return {
            "query_id": query.id,
            "fingerprint": query.fingerprint(),
            "task": query.task,
            "index": index,
            "shard": int(self.col.shard),
            "prompt_tokens": len(prompt_ids),
            "reference": query.reference,
            "target": {"text": target_text, "tokens": ar.tokens, "seconds": ar.seconds},
            "embedding_dim": int(embedding.numel()),
            "embedding": embedding.tolist(),
            "arms": arms,
            "drafters": self.fingerprints,
        }


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    col = cfg.collect
    check_options(col)
    shard, num_shards = int(col.shard), int(col.num_shards)
    s = Session.open(cfg, output_dir, RUN_FILES, "collect", SECTIONS)
    write_plan(s.out, len(s.queries))
    limits = Limits(
        max_new_tokens=col.max_new_tokens or s.limits.max_new_tokens, draft_length=s.limits.draft_length
    )
    if limits.max_new_tokens > s.limits.max_new_tokens:
        s.check_prompts(limits)
    traced = None
    if col.get("trace"):  # replay instead of decoding: greedy only (the trace's output and drafts are greedy)
        if not s.sampling.greedy:
            raise SpecbenchError(
                f"collect.trace replays greedy runs; this collection samples at temperature "
                f"{s.sampling.temperature:g}",
                "collect with decoding=greedy, or without collect.trace",
            )
        traced = TracedRuns(col.trace, cfg, list(s.pool), limits)
    collector = Collector(s, limits, traced)
    mine = [(i, q) for i, q in enumerate(s.queries) if i % num_shards == shard]
    path = s.out / rows_file(shard, num_shards)
    check_drafters(path, collector.fingerprints, bool(col.overwrite))
    done = {r["query_id"] for r in read_jsonl(path)}
    todo = [(i, q) for i, q in mine if q.id not in done]
    if done:
        log.info("resuming: %d of %d queries already collected in %s", len(mine) - len(todo), len(mine), path)
    if todo:
        collector.warm_up()
    with JsonlWriter(path) as writer:
        for index, query in tqdm(todo, desc=f"collect shard {shard}/{num_shards}", unit="query"):
            writer.write(collector.row(index, query))
    rows = read_rows([path])
    log.info("%d rows in %s", len(rows), path)
    print_collect_summary(rows, list(s.pool))
    return s.out


def check_drafters(path: Path, fingerprints: dict[str, str], overwrite: bool = False) -> None:
    """Refuse to resume rows collected with other drafter checkpoints (a head rebuilt in place under the same name:
    issue 34) than this run's, or with ``overwrite`` delete them; rows from before rows carried fingerprints are
    not checked."""
    changed = sorted(
        {
            a
            for r in read_jsonl(path)
            if r.get("drafters") is not None
            for a in set(r["drafters"]) | set(fingerprints)
            if r["drafters"].get(a) != fingerprints.get(a)
        }
    )
    if changed and overwrite:
        log.warning(
            "collect.overwrite=true: deleting %s (collected with other checkpoints of %s)",
            path,
            ", ".join(changed),
        )
        path.unlink()
    elif changed:
        raise SpecbenchError(
            f"{path}: rows collected with other drafter checkpoints than this run's "
            f"({', '.join(changed)} changed since), so they cannot be resumed",
            "collect into a new directory (hydra.run.dir=...), or pass collect.overwrite=true to "
            "collect again from the start",
        )


def print_collect_summary(rows: list[dict], arms: list[str]) -> None:
    import pandas as pd

    from specbench.pipelines.tables import print_table, to_markdown

    table = []
    for arm in arms:
        recs = [r["arms"][arm] for r in rows if arm in r["arms"]]
        al = [x["alignment"] for x in recs if x.get("alignment") is not None]
        cm = [x["cost_measured"] for x in recs if x.get("cost_measured") is not None]
        sp = [x["spec"]["speedup"] for x in recs if x.get("spec") and x["spec"].get("speedup")]
        table.append(
            {
                "arm": arm,
                "queries": len(recs),
                "standalone": recs[0]["standalone"] if recs else None,
                "alignment": sum(al) / len(al) if al else None,
                "cost_params": recs[0]["cost_params"] if recs else None,
                "cost_measured": sum(cm) / len(cm) if cm else None,
                "spec_speedup": sum(sp) / len(sp) if sp else None,
            }
        )
    print_table(to_markdown(pd.DataFrame(table)), title=f"collect: {len(rows)} queries (means over queries)")
