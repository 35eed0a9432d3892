"""The records a run writes as each generation finishes: ``examples.jsonl`` (one object per generation) and
``rounds.jsonl`` (one per round), resumable (``Records``: finished generations are skipped, duplicates and orphan
rounds refused or dropped, changed queries or checkpoints refused)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

from specbench.decoding.drafter import AUTOREGRESSIVE
from specbench.decoding.loop import Generation
from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text
from specbench.pipelines.session.prompting import query_fingerprint
from specbench.records import (
    EXAMPLE_KEYS,
    EXAMPLES,
    ROUNDS,
    ExampleRecord,
    JsonlWriter,
    read_jsonl,
    round_row,
)
from specbench.tasks import metrics

log = logging.getLogger(__name__)


def example_record(
    query,
    ex_id: str,
    method: str,
    gen: Generation,
    text: str,
    reference: str | None,
    tie_tolerance: float | None = None,
    **extra,
) -> ExampleRecord:
    """The ``examples.jsonl`` record of one finished generation (quality scored against ``reference``;
    ``tie_tolerance``: the run's, kept beside the generation's deciders)."""
    return ExampleRecord(
        deciders=gen.deciders,
        tie_tolerance=tie_tolerance if gen.deciders is not None else None,
        prompt_sha=gen.prompt_sha,
        query_id=ex_id,
        task=query.task,
        method=method,
        output_ids=gen.tokens,
        text=text,
        new_tokens=len(gen.tokens),
        seconds=gen.seconds,
        target_calls=gen.target_calls,
        rounds=len(gen.rounds),
        drafted=gen.drafted,
        accepted=gen.accepted,
        switches=gen.switches,
        t_switch=sum(r.t_switch for r in gen.rounds),
        t_select=sum(r.t_select for r in gen.rounds),
        stop=gen.stop,
        category=query.category,
        reference=reference,
        quality=metrics.score(query.kind, text, reference),
        deferred=gen.deferred,
        **extra,
    )


DUPLICATES_SHOWN = 5


class Records:
    """``examples.jsonl`` and ``rounds.jsonl`` of a run directory, appended as generations finish.

    ``done``: the (query id, method) pairs already written (a rerun into the directory skips them).
    On opening (a resume):

    - duplicated (query id, method) records (two processes that wrote one directory) are refused;
    - ``rounds.jsonl`` lines whose generation has no example record (a run stopped between the two
      appends, or a damaged example line deleted) are dropped, so a redone generation's rounds are not
      counted twice (the file is rewritten atomically);
    - with ``queries`` (and ``drafters``: ``{arm: checkpoint fingerprint}``), a finished record made from
      another content of its query (the data file changed: :func:`query_fingerprint`) or other drafter
      checkpoints (retrained) is refused, naming the query ids; with ``overwrite`` it is dropped and redone.

    Every record written carries ``process`` (one id per ``Records``, i.e. per run process), so speedups
    pair only generations timed in one process (``tables.summarize``), and the fingerprints.
    """

    def __init__(
        self,
        out: Path,
        tie_tolerance: float | None = None,
        *,
        queries=None,
        drafters: Mapping[str, str] | None = None,
        overwrite: bool = False,
    ):
        self.out = Path(out)
        self.tie_tolerance = tie_tolerance
        self.process = uuid.uuid4().hex[:12]
        self.fingerprints = None if queries is None else {q.id: query_fingerprint(q) for q in queries}
        self.drafters = dict(drafters or {})
        path = self.out / EXAMPLES
        examples = []
        for i, rec in enumerate(read_jsonl(path), 1):
            missing = [k for k in EXAMPLE_KEYS if not isinstance(rec, dict) or k not in rec]
            if missing:
                have = ", ".join(rec) if isinstance(rec, dict) else f"a JSON {type(rec).__name__}"
                raise SpecbenchError(
                    f"{path}: record {i} has no {', '.join(missing)} (it has: {have})",
                    f"repair or delete line {i} of {path} (or rerun into a new directory)",
                )
            examples.append((i, rec))
        self._check_duplicates(path, examples)
        stale = self._stale([rec for _, rec in examples])
        if stale:
            examples = self._drop_stale(path, examples, stale, overwrite)
        self.done = {(rec["query_id"], rec["method"]) for _, rec in examples}
        self._drop_orphan_rounds({(rec["query_id"], rec["method"]): rec for _, rec in examples})
        if self.done:
            log.info("resuming: %d finished generations found in %s", len(self.done), self.out)
        self._rounds = self._examples = None

    @staticmethod
    def _check_duplicates(path: Path, examples) -> None:
        seen: dict[tuple[str, str], list[int]] = {}
        for i, rec in examples:
            seen.setdefault((rec["query_id"], rec["method"]), []).append(i)
        dup = {k: v for k, v in seen.items() if len(v) > 1}
        if not dup:
            return
        shown = "; ".join(
            f"{q} / {m} (lines {', '.join(map(str, v))})"
            for (q, m), v in list(dup.items())[:DUPLICATES_SHOWN]
        )
        more = f" and {len(dup) - DUPLICATES_SHOWN} more" if len(dup) > DUPLICATES_SHOWN else ""
        raise SpecbenchError(
            f"{path} holds {len(dup)} (query id, method) pair(s) more than once: {shown}{more}; two runs wrote "
            "this directory at once, so its records (and any summary of them) are doubled",
            f"rerun into a new directory (hydra.run.dir=...), or delete {path} and rounds.jsonl beside it to start "
            "it again",
        )

    def _stale(self, examples: list[dict]) -> dict[tuple[str, str], str]:
        """``{(query id, method): why}`` for finished records made from other inputs than this run's."""
        out: dict[tuple[str, str], str] = {}
        for rec in examples:
            key = (rec["query_id"], rec["method"])
            base = str(rec["query_id"]).split("/turn")[0]
            if self.fingerprints is not None and rec.get("query_sha") is not None:
                now = self.fingerprints.get(rec["query_id"], self.fingerprints.get(base))
                if now is None:
                    out[key] = "its query is no longer in the dataset"
                elif now != rec["query_sha"]:
                    out[key] = "its query's content changed in the data"
            if key not in out and rec["method"] != AUTOREGRESSIVE and rec.get("drafters") is not None:
                changed = sorted(
                    a
                    for a in set(rec["drafters"]) | set(self.drafters)
                    if rec["drafters"].get(a) != self.drafters.get(a)
                )
                if changed:
                    out[key] = f"drafter checkpoint(s) changed: {', '.join(changed)}"
        return out

    def _drop_stale(self, path: Path, examples, stale: dict, overwrite: bool):
        ids = list(dict.fromkeys(q for q, _ in stale))
        whys = sorted(set(stale.values()))
        what = (
            f"{len(stale)} finished generation(s) of {len(ids)} query id(s) ({', '.join(ids[:10])}"
            + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
            + ")"
        )
        if not overwrite:
            raise SpecbenchError(
                f"{path}: {what} were made from other inputs than this run's ({'; '.join(whys)}), so they cannot "
                "be resumed",
                "rerun into a new directory (hydra.run.dir=...), or pass overwrite=true to redo them",
            )
        log.warning("overwrite=true: redoing %s in %s (%s)", what, self.out, "; ".join(whys))
        kept = [(i, rec) for i, rec in examples if (rec["query_id"], rec["method"]) not in stale]
        rewrite_jsonl(path, [rec for _, rec in kept])
        return kept

    def _drop_orphan_rounds(self, finished: dict[tuple[str, str], dict]) -> None:
        path = self.out / ROUNDS
        if not path.exists():
            return
        by_pair: dict[tuple[str, str], list[dict]] = {}
        rows = list(read_jsonl(path))
        for row in rows:
            by_pair.setdefault((row.get("query_id"), row.get("method")), []).append(row)
        kept: list[dict] = []
        orphans = extra = 0
        for key, group in by_pair.items():
            rec = finished.get(key)
            if rec is None:
                orphans += len(group)
                continue
            n = rec.get("rounds")
            if (
                isinstance(n, int) and len(group) > n
            ):  # rounds of an earlier, unfinished try of the pair: keep the last
                extra += len(group) - n
                group = group[len(group) - n :]
            kept.extend(group)
        if not orphans and not extra:
            return
        log.warning(
            "%s: dropping %d round line(s) without their example record and %d of an earlier unfinished "
            "try (a run stopped between appending a generation's rounds and its example, or an example "
            "line was deleted): the resume redoes those generations",
            path,
            orphans,
            extra,
        )
        order = {id(r): i for i, r in enumerate(rows)}
        rewrite_jsonl(path, sorted(kept, key=lambda r: order[id(r)]))

    def __enter__(self):
        self._rounds = JsonlWriter(self.out / ROUNDS)
        self._examples = JsonlWriter(self.out / EXAMPLES)
        return self

    def __exit__(self, *exc):
        self._rounds.close()
        self._examples.close()

    def write(
        self, query, ex_id: str, method: str, gen: Generation, text: str, reference: str | None, **extra
    ):
        extra.setdefault("process", self.process)
        if self.fingerprints is not None:
            extra.setdefault("query_sha", self.fingerprints.get(query.id) or query_fingerprint(query))
        if method != AUTOREGRESSIVE:
            extra.setdefault("drafters", dict(self.drafters))
        self._rounds.write_many(round_row(ex_id, query.task, method, r) for r in gen.rounds)
        self._examples.write(
            example_record(query, ex_id, method, gen, text, reference, self.tie_tolerance, **extra)
        )
        self.done.add((ex_id, method))

    def examples(self) -> list[dict]:
        return list(read_jsonl(self.out / EXAMPLES))

    def rounds(self) -> list[dict]:
        return list(read_jsonl(self.out / ROUNDS))


def rewrite_jsonl(path: Path, rows: Iterable[dict]) -> None:
    """Replace a JSONL file whole with ``rows`` (atomically: :func:`specbench.files.atomic_write_text`)."""
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def write_after_stop(records: Records, out: Path, command: str, what: str, write) -> None:
    """A run that stops (an error, Ctrl-C) still leaves ``what`` (its summary, its curves) of the generations it
    finished, written by ``write()``; a failure to write it is logged (one line for a full disk), never hiding the
    error that stopped the run."""
    finished = len(records.examples())
    if not finished:
        return
    log.error(
        "%s stopped early: writing the %s of the %d generations it finished in %s",
        command,
        what,
        finished,
        out,
    )
    try:
        write()
    except OSError as exc:  # a full disk: one line (the error that stopped the run follows, as error/fix)
        log.error("could not write the %s of the finished generations: %s", what, exc)
    except Exception:  # noqa: BLE001 - never hide the error that stopped the run
        log.exception("could not write the %s of the finished generations", what)
