"""A collection on disk (what ``specbench collect`` writes): its rows files (``rows.jsonl``, or one
``rows-<i>-of-<n>.jsonl`` per shard), its settings (``collect_config.yaml``) and its size (``collect_plan.yaml``);
reading the rows of several directories, what a collection lacks, and ``merge`` (``specbench merge``)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path

from omegaconf import OmegaConf

from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text, existing
from specbench.pipelines.session.run_dir import compared_settings, differences, save_config
from specbench.records import ROWS, read_jsonl

log = logging.getLogger(__name__)

SIGNATURE_FILE = "collect_config.yaml"
# how many queries the whole collection has (all shards): train-policy checks it
PLAN_FILE = "collect_plan.yaml"
SHARD_FILE = re.compile(r"rows-(\d+)-of-(\d+)\.jsonl")


def rows_file(shard: int, num_shards: int) -> str:
    return ROWS if num_shards == 1 else f"rows-{shard:05d}-of-{num_shards:05d}.jsonl"


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
            raise SpecbenchError(
                f"no collected rows in {path}",
                "run `specbench collect` first and pass its output directory (data=<dir>)",
            )
        for f in files:
            for row in read_jsonl(f):
                qid = row["query_id"]
                if origin.setdefault(qid, path) != path:
                    raise SpecbenchError(
                        f"query id '{qid}' is in both {origin[qid]} and {path}: the directories overlap (the same "
                        "query collected twice) or hold different datasets whose ids collide",
                        "pass each collection once (the shards of one collection do not overlap), and combine "
                        "only collections of different queries",
                    )
                rows.setdefault(qid, row)
    return sorted(rows.values(), key=lambda r: (r["index"], r["query_id"]))


def collection_settings(path: str | Path) -> dict:
    """The settings a collect directory's rows were made with (its ``collect_config.yaml``; for a
    rows file, the one beside it)."""
    path = Path(path)
    existing(path, "the collect directory", "pass the output directories of `specbench collect` runs")
    sig = (path if path.is_dir() else path.parent) / SIGNATURE_FILE
    if not sig.exists():
        raise SpecbenchError(
            f"{path} is not a collect directory (no {SIGNATURE_FILE})",
            "pass the output directories of `specbench collect` runs",
        )
    return compared_settings(OmegaConf.load(sig))


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
    if name == ROWS:
        return 0, 1
    m = SHARD_FILE.fullmatch(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def incomplete(paths: Iterable[str | Path]) -> list[str]:
    """What the collection in ``paths`` lacks: missing shard files, and rows files with fewer rows than
    their shard takes of the collection (``collect_plan.yaml``: a collect that stopped early)."""
    paths = [Path(p) for p in paths]
    problems = [
        f"shard file(s) {', '.join(missing)} missing" for missing in [missing_shards(paths)] if missing
    ]
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


def merge(
    sources: list[str], out: str | Path, overwrite: bool = False, allow_incomplete: bool = False
) -> Path:
    """Join the rows of several collect directories (shards) into ``out/rows.jsonl``.

    The directories must hold the same collect settings (``collect_config.yaml``, shard settings
    aside) and no query twice. ``out`` must not hold a collection already unless ``overwrite`` (its
    rows are then replaced). An incomplete collection (shard files missing, a shard with fewer rows than its plan:
    stopped early or still being collected: :func:`incomplete`) is refused unless ``allow_incomplete`` (then
    logged as a warning).
    """
    out = Path(out)
    sigs = [collection_settings(src) for src in sources]
    for src, sig in zip(sources[1:], sigs[1:]):
        diff = differences(sigs[0], sig)
        if diff:
            raise SpecbenchError(
                f"{sources[0]} and {src} hold rows of different collect configs; differs in: "
                + "; ".join(diff),
                "merge the shards of one collection only",
            )
    existing = sorted(out.glob("rows*.jsonl")) + (
        [out / SIGNATURE_FILE] if (out / SIGNATURE_FILE).exists() else []
    )
    if existing and not overwrite:
        raise SpecbenchError(
            f"{out} already holds a collection ({', '.join(p.name for p in existing)}): merging "
            "into it would replace its rows",
            "merge into a new directory (--out <new dir>), or pass --overwrite to replace them",
        )
    problems = incomplete(sources)
    if problems and not allow_incomplete:
        raise SpecbenchError(
            f"the collection in {', '.join(map(str, sources))} is incomplete: "
            + "; ".join(problems)
            + " (a collect that stopped early or is still running)",
            "finish it (rerun each collect into its directory: it resumes; collect missing shards with "
            "collect.shard=<i> collect.num_shards=<n>), or merge what is there with --allow-incomplete",
        )
    if problems:
        log.warning("merging an incomplete collection (--allow-incomplete): %s", "; ".join(problems))
    rows = read_rows(sources)
    out.mkdir(parents=True, exist_ok=True)
    for f in existing + ([out / PLAN_FILE] if (out / PLAN_FILE).exists() else []):
        f.unlink()
    target_file = out / ROWS
    save_config(OmegaConf.create(sigs[0]), out / SIGNATURE_FILE)
    plans = {read_plan(src) for src in sources}
    if len(plans) == 1 and None not in plans:  # the merged collection's size: train-policy checks it
        write_plan(out, plans.pop())
    atomic_write_text(target_file, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    log.info("merged %d rows from %d directories into %s", len(rows), len(sources), target_file)
    return target_file
