"""Record types every pipeline reads and writes, and append-as-you-go JSONL files.

- round: one speculative round of one (query, method) (``Round`` plus the ids, ``round_row``);
- example: one finished generation of one (query, method);
- summary rows are derived from example records only (``pipelines/tables.py``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text

log = logging.getLogger(__name__)


@dataclass
class Round:
    """One speculative round, as the decode loop reports it (times in seconds)."""

    index: int
    arm: str
    drafted: int
    accepted: int
    n_max: int
    be: float
    bd: float
    emitted: int
    t_select: float
    t_draft: float
    t_verify: float
    t_switch: float
    switched: bool
    deferred: int = 0  # drafted positions a cascade rule deferred to the target (0: no cascade rule)
    first_use: bool = False  # the drafter did its per-query setup in this round (timed in t_switch)
    # Tree rounds (several drafts verified in one forward; ``arm`` is ``tree:<a>+<b>``): the drafters whose
    # drafts entered the tree, its node count (also set, alone, when one drafter's own draft was a tree), the accepted length each draft had along the tree's rows (greedy:
    # exactly what it would have had alone; sampling: how far it followed the accepted path), and the
    # members whose draft reached the round's accepted length (they share the credit). None / 0 otherwise.
    members: list[str] | None = None
    tree_size: int = 0
    member_accepted: dict[str, int] | None = None
    winners: list[str] | None = None
    # Rounds a cost-model budget built (``selector=budget``): the accepted tokens it expected of the verified tree
    # and the seconds it predicted for the round (drafting and verification), beside the measured ones above.
    expected: float | None = None
    predicted_s: float | None = None
    # ...the context length it was priced at (the committed tokens), and what decided it (``Plan.label``: ``plan``,
    # ``probe:<arm>``, ``floor:<arm>``)
    context: int | None = None
    decided: str | None = None
    # Batched decoding: the batch's target forward (from 0) that verified this round; None decoding one query alone.
    forward: int | None = None


def round_row(query_id: str, task: str, method: str, rnd: Round) -> dict:
    """A ``rounds.jsonl`` line: which generation the round belongs to, then the round itself."""
    row = {"query_id": query_id, "task": task, "method": method, "round": rnd.index}
    row.update((k, v) for k, v in asdict(rnd).items() if k != "index")
    return row


@dataclass
class ExampleRecord:
    query_id: str
    task: str
    method: str
    output_ids: list[int]
    text: str
    new_tokens: int
    seconds: float
    target_calls: int
    rounds: int
    drafted: int
    accepted: int
    switches: int
    t_switch: float
    stop: str
    t_select: float = 0.0
    category: str | None = None
    turn: int = 1
    # a conversation_length run: the chat this generation is a turn of (its first query's id) and which turn (1-based)
    conversation: str | None = None
    conversation_turn: int | None = None
    reference: str | None = None
    quality: dict = field(default_factory=dict)
    deferred: int = 0  # sum of the rounds' deferred positions (cascade rules)
    agreement: dict = field(
        default_factory=dict
    )  # vs the autoregressive output of the same query, when known
    # Greedy lossless decoding: per output position [id1, id2, logit1, logit2] of the row that chose it, and
    # the run's tie tolerance (decoding/certify.py): what a fork from the autoregressive output is judged by.
    deciders: list | None = None
    tie_tolerance: float | None = None
    # fingerprint of the prompt ids: a fork after a differing prompt is inherited
    prompt_sha: str | None = None
    # What a resume checks and what the summary pairs by (pipelines/session/run_records.py Records): the query's content
    # fingerprint, the fingerprints of the pool's drafter checkpoints, and the id of the process that timed it.
    query_sha: str | None = None
    drafters: dict | None = None
    process: str | None = None


# the fields every examples.jsonl line must have (the others have defaults)
EXAMPLE_KEYS = tuple(
    f.name for f in fields(ExampleRecord) if f.default is MISSING and f.default_factory is MISSING
)


class JsonlWriter:
    """Appends one JSON object per line and flushes it, so an interrupted run keeps every line."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_torn_tail(self.path)
        self._fh = self.path.open("a", encoding="utf-8")

    def write(self, record) -> None:
        self.write_many([record])

    def write_many(self, records) -> None:
        """Append dataclass instances or dicts, one line each, then flush."""
        try:
            for rec in records:
                row = asdict(rec) if hasattr(rec, "__dataclass_fields__") else rec
                self._fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            self._fh.flush()
        except OSError as exc:  # write() errors name no file (a full disk): name it
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line left without its newline by a killed run, so appends start on a fresh line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as fh:
        data = fh.read()
        if data.endswith(b"\n"):
            return
        fh.truncate(data.rfind(b"\n") + 1)


def read_jsonl(path: Path) -> Iterator[dict]:
    """Read records, one JSON object per line.

    A torn last line (no newline at its end: a run killed mid-write) is skipped with a warning;
    ``JsonlWriter`` cuts it before appending. Any other line that is not a JSON object (valid UTF-8)
    is corruption, not an interruption: SpecbenchError naming the file and the line number.
    """
    path = Path(path)
    if not path.exists():
        return
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                if not raw.endswith(b"\n"):  # only the last line can lack its newline
                    log.warning(
                        "%s:%d: skipping a torn last line (a run stopped while writing it)", path, lineno
                    )
                    return
                what = (
                    f"not UTF-8 text ({exc.reason} at byte {exc.start} of the line)"
                    if isinstance(exc, UnicodeDecodeError)
                    else f"line {lineno} is not a JSON record ({exc})"
                )
                raise SpecbenchError(
                    f"{path}:{lineno}: {what}: the file is corrupted (an interrupted run leaves at "
                    "most a torn last line)",
                    f"repair or delete line {lineno} of {path}, or rerun into a new directory",
                ) from exc
            if not isinstance(record, dict):
                raise SpecbenchError(
                    f"{path}:{lineno}: line {lineno} is not a JSON object: the file is corrupted",
                    f"repair or delete line {lineno} of {path}, or rerun into a new directory",
                )
            yield record


# ---------------------------------------------------------------- the record files of a run directory
# (one place, on the ground floor: the writers and the readers import them; reproduction/runs.py re-exports them)
EXAMPLES = "examples.jsonl"  # eval, cascades, replay, trace: one record per generation
ROUNDS = "rounds.jsonl"  # eval, replay: one record per round
BATCHES = "batches.jsonl"  # eval at decoding.batch_size > 1: one record per decoded batch
ROWS = "rows.jsonl"  # collect: one row per collected query (one shard)
SEEDS = "seeds.jsonl"  # replay: one record per (method, seed, query)
CONFIG = "config.yaml"  # every command: the settings its records were made with
PROVENANCE = (
    "provenance.json"  # every command: the code commit, packages and machine of each process that ran it
)
SUMMARY = "summary.md"  # eval: its summary table (says when the run stopped early)
SUMMARY_CSV = "summary.csv"  # eval: the same table as CSV
METRICS = (
    "metrics.json"  # train-drafter, train-policy: the run's metrics (read by the shipped heads, the report)
)
HISTORY_CSV = "history.csv"  # train-drafter, train-policy: one row per epoch
SIGNATURE = (
    "signature.json"  # train-drafter: what a checkpoint was trained from (compared on resume, shipped)
)
BENCH = "bench.jsonl"  # bench: one record per timed generation
CONVERGENCE_CSV = (
    "convergence.csv"  # eval, replay: a selector's share on the best drafter by round (the report)
)
FORKS_CSV = "forks.csv"  # eval: where outputs left the autoregressive one, each fork's tie verdict
SEEDS_CSV = "seeds.csv"  # replay: per method, over seeds
CURVES = "curves"  # cascades: curves.csv / curves.md, quality against speed per (task, method)
CURVES_CSV = f"{CURVES}.csv"
BEST_CSV = "best.csv"  # cascades: the fastest alpha per rule within the quality tolerance
ALPHA_SWEEP = "alpha_sweep"  # train-policy sweep.alpha: one policy per alpha (.csv, .md)
ALPHA_SWEEP_CSV = f"{ALPHA_SWEEP}.csv"
ALPHA_SWEEP_QUERIES_CSV = "alpha_sweep_queries.csv"  # the same, each alpha's chosen arm per validation query
DATA_EFFICIENCY = (
    "data_efficiency"  # train-policy sweep.n_examples: one policy per training-set size (.csv, .md)
)
DATA_EFFICIENCY_CSV = f"{DATA_EFFICIENCY}.csv"
DATA_EFFICIENCY_QUERIES_CSV = "data_efficiency_queries.csv"  # the same, per validation query
# a saved model's files (a head, the small drafter, the embedded target): transformers' names
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

# what a multi-part run set out to write: readers check it is all there (``unfinished``)
PLAN_FILE = "plan.json"


def write_plan(out: Path, what: str, parts: list[str]) -> None:
    """``plan.json`` in ``out``: ``parts`` (e.g. query ids), the whole of what this run (``what``) will write."""
    atomic_write_text(Path(out) / PLAN_FILE, json.dumps({"what": what, "parts": [str(p) for p in parts]}))


def unfinished(out: Path, have) -> list[str]:
    """The planned parts of ``out`` (its ``plan.json``) that ``have`` lacks, in plan order; [] when all are there or
    the run kept no plan (made before plans were written)."""
    path = Path(out) / PLAN_FILE
    try:
        parts = json.loads(path.read_text(encoding="utf-8")).get("parts")
    except (OSError, ValueError, AttributeError):
        return []
    done = {str(h) for h in have}
    return [p for p in parts or [] if p not in done] if isinstance(parts, list) else []
