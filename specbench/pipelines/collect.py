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
  exact match); ``train-policy reward.alignment=acceptance`` scores arms by accepted / drafted.

Raw scores are kept (not a combined reward), so ``train-policy`` can change alpha, the cost kind
and the arm set without collecting again. A rerun into the same directory skips finished queries
(its settings must match the directory's ``collect_config.yaml``, else it is refused unless
``collect.overwrite``); ``collect.shard=i collect.num_shards=n`` takes every n-th query into
``rows-<i>-of-<n>.jsonl``, and ``specbench merge`` joins shard files (``read_rows`` reads every
``rows*.jsonl`` of a directory; a query id in two directories is refused, not dropped).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from specbench.arms import AUTOREGRESSIVE
from specbench.decoding.loop import Generation, Limits
from specbench.errors import SpecbenchError
from specbench.pipelines import speed
from specbench.pipelines.run_dir import RunFiles, differences, save_config, settings
from specbench.pipelines.session import Session
from specbench.pipelines.schedule import rotation
from specbench.records import JsonlWriter, atomic_write_text, read_jsonl
from specbench.tasks import metrics

log = logging.getLogger(__name__)

ALIGNMENTS = ("rougeL", "rouge1", "rouge2", "bleu")
SIGNATURE_FILE = "collect_config.yaml"
PLAN_FILE = "collect_plan.yaml"  # how many queries the whole collection has (all shards): train-policy checks it
SHARD_FILE = re.compile(r"rows-(\d+)-of-(\d+)\.jsonl")


def alignment(metric: str, drafter_text: str, target_text: str) -> float:
    """How well a drafter's own output matches the target's, in [0, 1]."""
    if metric == "bleu":
        return metrics.bleu(drafter_text, target_text) / 100.0
    if metric in ("rougeL", "rouge1", "rouge2"):
        return metrics.rouge(drafter_text, target_text)[metric] / 100.0
    raise SpecbenchError(f"unknown alignment metric '{metric}'", f"set collect.alignment to one of: {', '.join(ALIGNMENTS)}")


def rows_file(shard: int, num_shards: int) -> str:
    return "rows.jsonl" if num_shards == 1 else f"rows-{shard:05d}-of-{num_shards:05d}.jsonl"


def read_rows(paths: Iterable[str | Path]) -> list[dict]:
    """Every row of the given collect directories (all ``rows*.jsonl``), one per query id, in
    dataset order (``index``). Raises when a directory has no rows, and when two directories hold
    the same query id (a query collected twice, or two datasets whose ids collide): dropping one
    of them would lose data without a word. Within one directory (its shard files, one collection)
    a query collected twice is kept once."""
    rows: dict[str, dict] = {}
    origin: dict[str, Path] = {}
    for path in paths:
        path = Path(path)
        files = sorted(path.glob("rows*.jsonl")) if path.is_dir() else [path]
        if not any(f.exists() for f in files):
            raise SpecbenchError(f"no collected rows in {path}",
                                 "run `specbench collect` first and pass its output directory (data=<dir>)")
        for f in files:
            for row in read_jsonl(f):
                qid = row["query_id"]
                if origin.setdefault(qid, path) != path:
                    raise SpecbenchError(
                        f"query id '{qid}' is in both {origin[qid]} and {path}: the directories overlap (the same "
                        "query collected twice) or hold different datasets whose ids collide",
                        "pass each collection once (the shards of one collection do not overlap), and combine "
                        "only collections of different queries")
                rows.setdefault(qid, row)
    return sorted(rows.values(), key=lambda r: (r["index"], r["query_id"]))


# A collection's settings (``collect_config.yaml``): every setting but those that do not change the
# rows (session.NOT_COMPARED: threads, warm-up, overwrite, the shard a process takes).
RUN_FILES = RunFiles(results=("rows*.jsonl",), settings=SIGNATURE_FILE, overwrite="collect.overwrite")


def collection_settings(path: str | Path) -> dict:
    """The settings a collect directory's rows were made with (its ``collect_config.yaml``; for a
    rows file, the one beside it)."""
    path = Path(path)
    sig = (path if path.is_dir() else path.parent) / SIGNATURE_FILE
    if not sig.exists():
        raise SpecbenchError(f"{path} is not a collect directory (no {SIGNATURE_FILE})",
                             "pass the output directories of `specbench collect` runs")
    return settings(OmegaConf.load(sig))


def missing_shards(paths: Iterable[str | Path]) -> list[str]:
    """The shard files (``rows-<i>-of-<n>.jsonl``) that the given directories together lack."""
    have: dict[int, set[int]] = {}
    for path in paths:
        for f in Path(path).glob("rows-*-of-*.jsonl"):
            m = SHARD_FILE.fullmatch(f.name)
            if m:
                have.setdefault(int(m.group(2)), set()).add(int(m.group(1)))
    return [rows_file(i, n) for n, shards in sorted(have.items()) for i in range(n) if i not in shards]


def write_plan(out: Path, queries: int) -> None:
    """``collect_plan.yaml``: the number of queries of the whole collection (every shard together)."""
    atomic_write_text(Path(out) / PLAN_FILE, f"queries: {int(queries)}\n")


def read_plan(path: str | Path) -> int | None:
    """The number of queries a collect directory's collection has (its ``collect_plan.yaml``); None when
    unrecorded (a collection made before the plan was kept)."""
    f = Path(path) / PLAN_FILE
    if not f.is_file():
        return None
    try:
        n = OmegaConf.load(f).get("queries")
    except Exception:  # noqa: BLE001 - a damaged plan: nothing to check against
        log.warning("%s is unreadable: the collection's size is not checked", f)
        return None
    return int(n) if isinstance(n, int) else None


def shard_of(name: str) -> tuple[int, int] | None:
    """``(shard, num_shards)`` of a rows file name (``rows.jsonl``: the one shard of one), None for others."""
    if name == "rows.jsonl":
        return 0, 1
    m = SHARD_FILE.fullmatch(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def incomplete(paths: Iterable[str | Path]) -> list[str]:
    """What the collection in ``paths`` lacks: missing shard files, and rows files with fewer rows than
    their shard takes of the collection (``collect_plan.yaml``: a collect that stopped early)."""
    paths = [Path(p) for p in paths]
    problems = [f"shard file(s) {', '.join(missing)} missing" for missing in [missing_shards(paths)] if missing]
    for path in paths:
        total = read_plan(path) if path.is_dir() else read_plan(path.parent)
        files = sorted(path.glob("rows*.jsonl")) if path.is_dir() else [path]
        for f in files:
            shard = shard_of(f.name)
            if total is None or shard is None or not f.exists():
                continue
            i, n = shard
            want = len(range(i, total, n))
            have = len({r.get("query_id") for r in read_jsonl(f)})
            if have < want:
                problems.append(f"{f} has {have} of its {want} rows")
    return problems


def spec_summary(gen: Generation, ar: Generation) -> dict:
    return {"seconds": gen.seconds, "target_calls": gen.target_calls, "new_tokens": len(gen.tokens),
            "drafted": gen.drafted, "accepted": gen.accepted,
            "mat": speed.mat(len(gen.tokens), max(gen.target_calls, 1)),
            "speedup": ar.seconds / gen.seconds if gen.seconds else None, "exact_match": gen.tokens == ar.tokens}


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    col = cfg.collect
    shard, num_shards = int(col.shard), int(col.num_shards)
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise SpecbenchError(f"collect.shard={shard} collect.num_shards={num_shards} is not a valid shard",
                             "use 0 <= collect.shard < collect.num_shards")
    if col.alignment not in ALIGNMENTS:
        raise SpecbenchError(f"unknown alignment metric '{col.alignment}'",
                             f"set collect.alignment to one of: {', '.join(ALIGNMENTS)}")
    s = Session.open(cfg, output_dir, RUN_FILES, "collect")
    write_plan(s.out, len(s.queries))
    limits = Limits(max_new_tokens=col.max_new_tokens or s.limits.max_new_tokens, draft_length=s.limits.draft_length)
    if limits.max_new_tokens > s.limits.max_new_tokens:
        s.check_prompts(limits)
    pooling = str(cfg.embedding.pooling)
    arms = list(s.pool)
    drafters = [a for a in arms if a != AUTOREGRESSIVE]
    mine = [(i, q) for i, q in enumerate(s.queries) if i % num_shards == shard]
    path = s.out / rows_file(shard, num_shards)
    done = {r["query_id"] for r in read_jsonl(path)}
    todo = [(i, q) for i, q in mine if q.id not in done]
    if done:
        log.info("resuming: %d of %d queries already collected in %s", len(mine) - len(todo), len(mine), path)

    # A drafter's own greedy output: its module as the target of the one decode loop, autoregressive arm.
    alone = {a: s.alone(a) for a in drafters if s.pool[a].can_generate_alone}

    def speculative(arm: str, prompt_ids: list[int], seed: int, lim: Limits = limits) -> Generation:
        return s.decode(s.fixed(arm), prompt_ids, s.rng(seed=seed), limits=lim)

    if todo:
        s.warm_up(lambda prompt, lim, rng, a=a: speculative(a, prompt, 0, lim) for a in arms)

    with JsonlWriter(path) as writer:
        for index, query in tqdm(todo, desc=f"collect shard {shard}/{num_shards}", unit="query"):
            prompt_ids = s.prompter(query)
            seed = int(cfg.seed) * 1_000_003 + index
            embedding = s.target.embed(prompt_ids, pooling)
            own: dict[str, Generation] = {}
            spec: dict[str, Generation] = {}
            for ai in rotation(len(arms), index):  # every timed generation of the query, rotated like eval
                arm = arms[ai]
                if arm == AUTOREGRESSIVE:
                    spec[arm] = speculative(arm, prompt_ids, seed)
                    continue
                if arm in alone:
                    own[arm] = alone[arm](prompt_ids, s.rng(seed=seed), limits)
                if col.measure_speculative:
                    spec[arm] = speculative(arm, prompt_ids, seed)
            ar = spec[AUTOREGRESSIVE]
            target_text = s.text(ar.tokens)
            target_spt = ar.seconds / max(len(ar.tokens), 1)
            row_arms: dict[str, dict] = {AUTOREGRESSIVE: {
                "standalone": True, "alignment": 1.0, "cost_params": 1.0, "cost_measured": 1.0,
                "seconds": ar.seconds, "new_tokens": len(ar.tokens),
                **({"spec": spec_summary(ar, ar)} if col.measure_speculative else {})}}
            for arm in drafters:
                rec: dict = {"standalone": arm in alone, "cost_params": float(s.pool[arm].cost)}
                if arm in own:
                    text = s.text(own[arm].tokens)
                    rec.update(text=text, new_tokens=len(own[arm].tokens), seconds=own[arm].seconds,
                               alignment=alignment(str(col.alignment), text, target_text),
                               cost_measured=(own[arm].seconds / max(len(own[arm].tokens), 1)) / target_spt
                               if target_spt else None)
                else:
                    rec.update(alignment=None, cost_measured=None)
                if col.measure_speculative:
                    rec["spec"] = spec_summary(spec[arm], ar)
                row_arms[arm] = rec
            writer.write({"query_id": query.id, "fingerprint": query.fingerprint(), "task": query.task,
                          "index": index, "shard": shard,
                          "prompt_tokens": len(prompt_ids), "reference": query.reference,
                          "target": {"text": target_text, "tokens": ar.tokens, "seconds": ar.seconds},
                          "embedding_dim": int(embedding.numel()), "embedding": embedding.tolist(),
                          "arms": row_arms})
    rows = read_rows([path])
    log.info("%d rows in %s", len(rows), path)
    print_collect_summary(rows, arms)
    return s.out


def print_collect_summary(rows: list[dict], arms: list[str]) -> None:
    import pandas as pd

    from specbench.pipelines.tables import print_table, to_markdown

    table = []
    for arm in arms:
        recs = [r["arms"][arm] for r in rows if arm in r["arms"]]
        al = [x["alignment"] for x in recs if x.get("alignment") is not None]
        cm = [x["cost_measured"] for x in recs if x.get("cost_measured") is not None]
        sp = [x["spec"]["speedup"] for x in recs if x.get("spec") and x["spec"].get("speedup")]
        table.append({"arm": arm, "queries": len(recs), "standalone": recs[0]["standalone"] if recs else None,
                      "alignment": sum(al) / len(al) if al else None, "cost_params": recs[0]["cost_params"] if recs else None,
                      "cost_measured": sum(cm) / len(cm) if cm else None,
                      "spec_speedup": sum(sp) / len(sp) if sp else None})
    print_table(to_markdown(pd.DataFrame(table)), title=f"collect: {len(rows)} queries (means over queries)")


def merge(sources: list[str], out: str | Path, overwrite: bool = False) -> Path:
    """Join the rows of several collect directories (shards) into ``out/rows.jsonl``.

    The directories must hold the same collect settings (``collect_config.yaml``, shard settings
    aside) and no query twice. ``out`` must not hold a collection already unless ``overwrite`` (its
    rows are then replaced). Shard files missing from a sharded collection are logged as a warning.
    """
    out = Path(out)
    sigs = [collection_settings(src) for src in sources]
    for src, sig in zip(sources[1:], sigs[1:]):
        diff = differences(sigs[0], sig)
        if diff:
            raise SpecbenchError(f"{sources[0]} and {src} hold rows of different collect configs; differs in: "
                                 + "; ".join(diff), "merge the shards of one collection only")
    existing = sorted(out.glob("rows*.jsonl")) + ([out / SIGNATURE_FILE] if (out / SIGNATURE_FILE).exists() else [])
    if existing and not overwrite:
        raise SpecbenchError(f"{out} already holds a collection ({', '.join(p.name for p in existing)}): merging "
                             "into it would replace its rows",
                             "merge into a new directory (--out <new dir>), or pass --overwrite to replace them")
    missing = missing_shards(sources)
    if missing:
        log.warning("merging an incomplete collection: shard file(s) %s are missing (collect them with "
                    "collect.shard=<i> collect.num_shards=<n> and merge again)", ", ".join(missing))
    rows = read_rows(sources)
    out.mkdir(parents=True, exist_ok=True)
    for f in existing + ([out / PLAN_FILE] if (out / PLAN_FILE).exists() else []):
        f.unlink()
    target_file = out / "rows.jsonl"
    save_config(OmegaConf.create(sigs[0]), out / SIGNATURE_FILE)
    plans = {read_plan(src) for src in sources}
    if len(plans) == 1 and None not in plans:  # the merged collection's size: train-policy checks it
        write_plan(out, plans.pop())
    atomic_write_text(target_file, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    log.info("merged %d rows from %d directories into %s", len(rows), len(sources), target_file)
    return target_file
