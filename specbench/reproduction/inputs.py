"""What an exhibit reads from a run directory: its tables (a missing run is ``NotRun``; an empty or torn table a
clear error), its per-query records (``examples.jsonl``) and per-round records (``rounds.jsonl``), and whether
the run finished (``unfinished``)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pandas as pd

from specbench.errors import SpecbenchError
from specbench.records import METRICS
from specbench.reproduction.runs import (
    CONFIG,
    DONE,
    EXAMPLES,
    RECORD_FILES,
    ROOT_RECORD,
    ROUNDS,
    ROWS,
    SUMMARY,
)


class NotRun(Exception):
    """A run an exhibit needs is not there (yet)."""


def run_table(root: Path, rel: str) -> pd.DataFrame:
    path = root / rel
    if not path.exists():
        raise NotRun(rel)
    return read_table(path)


def read_table(path: Path) -> pd.DataFrame:
    """A CSV our commands wrote; an empty (0-byte) or torn one (cut mid-line by a stopped run) is refused,
    naming the file and the step that writes it."""
    step = path.parent
    fix = (
        f"run its step again: delete {step / DONE} if it is there, then rerun `specbench reproduce` with the same "
        "options (the step resumes from its records and writes the file again; add --redo if it then names the "
        "steps that read it), or rerun the command that wrote the file into that directory"
    )
    data = path.read_bytes()
    if not data.strip():
        raise SpecbenchError(
            f"{path} is empty ({len(data)} bytes): the run that writes it stopped before it finished", fix
        )
    if not data.endswith(b"\n"):
        raise SpecbenchError(
            f"{path} is torn (its last line is cut off): the run that writes it stopped while writing it", fix
        )
    try:
        return pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise SpecbenchError(
            f"{path} cannot be read as a table ({str(exc).strip().splitlines()[0]})", fix
        ) from None


def count_lines(path: Path) -> int:
    """The non-blank lines of ``path`` (its records); 0 when it is not there."""
    if not path.is_file():
        return 0
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def _command_of(out: Path) -> str | None:
    """Which command wrote the run directory ``out``: from the records it holds."""
    for name, command in ((EXAMPLES, "eval"), (ROWS, "collect")):
        if (out / name).exists():
            if command == "eval" and (out / CONFIG).exists():
                from omegaconf import OmegaConf

                try:
                    return "cascades" if "rules" in OmegaConf.load(out / CONFIG) else "eval"
                except Exception:  # noqa: BLE001 - an unreadable config: counted as eval
                    return "eval"
            return command
    return None


def planned(out: Path, command: str | None) -> int | None:
    """How many generations (eval, cascades) or queries (collect) the run in ``out`` plans, from its
    ``config.yaml`` and its data files (None when that cannot be worked out without loading models)."""
    from omegaconf import OmegaConf

    from specbench.arms import AUTOREGRESSIVE
    from specbench.tasks import load_dataset_config

    try:
        cfg = OmegaConf.load(out / CONFIG)
        queries = load_dataset_config(cfg.dataset)
        if command == "collect":
            shard, shards = int(cfg.collect.shard), int(cfg.collect.num_shards)
            return sum(1 for i, _ in enumerate(queries) if i % shards == shard)
        if command == "cascades":
            from specbench.pipelines.cascades import variants

            tasks = set(cfg.get("tasks") or [])
            return sum(1 for q in queries if not tasks or q.task in tasks) * len(
                variants(cfg.rules, cfg.alphas)
            )
        if command == "eval":
            from specbench.pipelines.methods import parse_methods
            from specbench.pipelines.session.prompting import turns_of

            max_turns = int(cfg.dataset.get("max_turns") or 1)
            pool = dict.fromkeys(
                [AUTOREGRESSIVE, *(k for k, v in (cfg.pool.get("drafters") or {}).items() if v)]
            )
            methods = parse_methods(cfg.methods, pool, cfg.get("selector"), cfg)
            return sum(turns_of(q, max_turns) for q in queries) * len(methods)
    except Exception:  # noqa: BLE001 - best effort: the count is left out
        return None
    return None


def unfinished(root: Path, run: str) -> str | None:
    """``unfinished: N of M generations`` when the run ``root/run`` stopped before it finished: a step of a
    ``specbench reproduce`` root without its ``.done``, a step whose records are fewer than its ``.done``
    counted, or an eval that wrote its summary of a run stopped early; else None."""
    out = Path(root) / run
    if not out.is_dir():
        return None
    command = _command_of(out)
    records = RECORD_FILES.get(command)
    file, what = (records.name, records.items) if records else ("", "generations")
    have = count_lines(out / file) if file else 0
    if (out / DONE).exists():
        try:
            want = json.loads((out / DONE).read_text(encoding="utf-8")).get("records")
        except (ValueError, AttributeError, UnicodeDecodeError):
            want = None
        if isinstance(want, int) and file and have < want:
            return f"unfinished: {have} of {want} {what} ({file} holds fewer than the step finished with)"
        return None
    summary = out / SUMMARY
    stopped = summary.is_file() and "stopped early" in summary.read_text(encoding="utf-8", errors="replace")
    if not stopped and not (Path(root) / ROOT_RECORD).exists():
        return None  # not a reproduce root: run directories without .done are complete runs
    if not file:
        return f"unfinished: {run} has no {DONE} (its step stopped before it finished)"
    want = planned(out, command)
    return (
        f"unfinished: {have} of {want} {what}"
        if want
        else f"unfinished: {have} {what}, the step did not finish"
    )


def optional_table(root: Path, rel: str) -> pd.DataFrame:
    try:
        return run_table(root, rel)
    except NotRun:
        return pd.DataFrame()


def speeds(summary: pd.DataFrame, value: str = "speedup") -> dict[str, dict[str, float]]:
    """``{task: {method: value}}`` from an eval summary (``all`` included)."""
    out: dict[str, dict[str, float]] = {}
    for row in summary.itertuples():
        out.setdefault(row.task, {})[row.method] = float(getattr(row, value))
    return out


def drafter_speeds(summary: pd.DataFrame, value: str = "speedup") -> dict[str, dict[str, float]]:
    """Only the fixed drafters, keyed by drafter name (``fixed:`` dropped)."""
    return {
        t: {m.split(":", 1)[1]: v for m, v in row.items() if m.startswith("fixed:")}
        for t, row in speeds(summary, value).items()
    }


def replayed(summary: pd.DataFrame) -> dict[str, float]:
    """train-policy's summary: ``{choice: speedup_replayed}`` (``policy``, ``always <arm>``, ...)."""
    if "speedup_replayed" not in summary:
        return {}
    return {str(c): float(s) for c, s in zip(summary.choice, summary.speedup_replayed)}


EXAMPLE_FIELDS = (
    "query_id",
    "task",
    "method",
    "seconds",
    "new_tokens",
    "target_calls",
    "switches",
    "quality",
    "process",
    "output_ids",
)

NOT_PAIRED = (
    "train-policy writes only aggregate replayed speedups (no per-query choice of the policy), so this "
    "cannot be paired per query"
)


def load_examples(root: Path, run: str, fields: tuple[str, ...] = EXAMPLE_FIELDS) -> pd.DataFrame:
    """The per-query records of the run ``root/run`` (its ``examples.jsonl``: one object per generation), one
    row per (query_id, method), the last record kept (as ``summarize`` does); empty when the file is absent. A
    torn last line (a stopped run) is skipped: ``mark_unfinished`` says the run is unfinished."""
    path = Path(root) / run / EXAMPLES
    rows = []
    if path.is_file():
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                rows.append({k: rec.get(k) for k in fields})
    df = pd.DataFrame(rows, columns=list(fields))
    for col in ("seconds", "new_tokens", "target_calls", "switches"):
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    return df.drop_duplicates(["query_id", "method"], keep="last").reset_index(drop=True)


def arm_choices(root: Path, run: str, method: str = "policy") -> dict[str, Counter]:
    """Per task (and ``ALL_TASKS``), how many of its queries ``method`` of the run ``root/run`` played on each arm:
    the arm of most of the query's rounds (a per-query policy plays one), from the run's ``rounds.jsonl``; empty when
    the file is absent."""
    from collections import defaultdict

    from specbench.pipelines.tables import ALL_TASKS
    from specbench.records import ROUNDS, read_jsonl

    path = Path(root) / run / ROUNDS
    per_query: dict[str, Counter] = defaultdict(Counter)
    task_of: dict[str, str] = {}
    for r in read_jsonl(path) if path.is_file() else []:
        if r.get("method") == method:
            per_query[r["query_id"]][str(r.get("arm"))] += 1
            task_of[r["query_id"]] = r.get("task")
    out: dict[str, Counter] = defaultdict(Counter)
    for q, counts in per_query.items():
        arm = counts.most_common(1)[0][0]
        out[task_of[q]][arm] += 1
        out[ALL_TASKS][arm] += 1
    return dict(out)


def query_arms(root: Path, run: str, method: str = "policy") -> dict[str, str]:
    """query id -> the arm ``method`` of the run ``root/run`` played on most of the query's rounds."""
    from specbench.records import ROUNDS, read_jsonl

    path = Path(root) / run / ROUNDS
    counts: dict[str, Counter] = {}
    for r in read_jsonl(path) if path.is_file() else []:
        if r.get("method") == method:
            counts.setdefault(r["query_id"], Counter())[str(r.get("arm"))] += 1
    return {q: c.most_common(1)[0][0] for q, c in counts.items()}


def choices_speed(root: Path, run: str, method: str = "policy") -> dict[str, float]:
    """Per task (and ``ALL_TASKS``): the speedup over autoregressive decoding that ``method``'s arm choices would
    give if each query ran at the speed its chosen arm ran alone in the same run (``fixed:<arm>``, or the
    autoregressive run), total seconds per token over the queries where both exist. Beside the method's own
    speedup, the gap is what choosing costs (embedding the prompt, the selector); NaN where the run has no
    single-arm records of the chosen arms."""
    from specbench.arms import AUTOREGRESSIVE
    from specbench.pipelines.tables import ALL_TASKS

    ex = load_examples(root, run)
    arms = query_arms(root, run, method)
    by = {(q, m): r for q, m, r in zip(ex.query_id, ex.method, ex.itertuples())}
    sums: dict[str, list[float]] = {}
    for q, arm in arms.items():
        chosen = by.get((q, AUTOREGRESSIVE if arm == AUTOREGRESSIVE else f"fixed:{arm}"))
        base = by.get((q, AUTOREGRESSIVE))
        if chosen is None or base is None:
            continue
        for task in (base.task, ALL_TASKS):
            acc = sums.setdefault(task, [0.0, 0.0, 0.0, 0.0])
            for i, x in enumerate((chosen.seconds, chosen.new_tokens, base.seconds, base.new_tokens)):
                acc[i] += float(x)
    return {
        t: (bs / bt) / (cs / ct) if cs > 0 and ct > 0 and bt > 0 else math.nan
        for t, (cs, ct, bs, bt) in sums.items()
    }


def choices_text(counts: Counter | None) -> str:
    """``"eagle_translation 12, autoregressive 4"``: queries per arm, most played first ("" when none)."""
    return ", ".join(f"{arm} {n}" for arm, n in (counts or Counter()).most_common())


def policy_metrics(root: Path, run: str) -> dict:
    """The train-policy run ``root/run``'s metrics.json ({} when absent or unreadable)."""
    try:
        found = json.loads((Path(root) / run / METRICS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def n_val_of(root: Path, run: str) -> int | None:
    """How many validation queries the train-policy run ``root/run`` judged on (its metrics.json), or None."""
    n = policy_metrics(root, run).get("n_val")
    return int(n) if isinstance(n, (int, float)) and n > 0 else None


def validation_choices(metrics: dict) -> Counter:
    """A train-policy run's arm shares on its validation queries as query counts (metrics.json's ``share``, ``n``)."""
    n = metrics.get("n") or metrics.get("n_val") or 0
    share = metrics.get("share") or {}
    return Counter({str(a): round(float(x) * n) for a, x in share.items() if round(float(x) * n)})


def load_round_values(
    root: Path,
    run: str,
    methods: tuple[str, ...] | None = None,
    fields: tuple[str, ...] = ("query_id", "task", "method", "round", "arm"),
) -> pd.DataFrame:
    """The per-round records (``rounds.jsonl``) of ``methods`` (None: every method) in ``root/run``, ``fields`` only."""
    path, rows = Path(root) / run / ROUNDS, []
    if path.is_file():
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if methods is not None and not any(f'"{m}"' in line for m in methods):
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if methods is None or rec.get("method") in methods:
                    rows.append({k: rec.get(k) for k in fields})
    return pd.DataFrame(rows, columns=list(fields))


def load_rounds(root: Path, run: str, methods: tuple[str, ...]) -> pd.DataFrame:
    """The per-round records of ``methods`` in the run ``root/run``: query_id, task, method, round, arm."""
    return load_round_values(root, run, methods)


# ---------------------------------------------------------------- per-query quality (the cascades, Table 1)


def task_columns(curves: pd.DataFrame) -> dict[str, str]:
    """task -> the quality column its run judged it on (curves.csv's ``metric``: the run's ``quality_metric`` or
    the task registry's), for the tasks with one."""
    if "metric" not in curves:
        return {}
    named = curves[curves.metric.fillna("").astype(str) != ""]
    return {str(t): str(m) for t, m in zip(named.task, named.metric)}


def task_quality(ex: pd.DataFrame, key: str) -> pd.Series:
    """Per-record quality on the column ``key`` of the records' metric (NaN where a record has none)."""
    return pd.Series(
        [
            float((q or {}).get(key)) if isinstance(q, dict) and (q or {}).get(key) is not None else math.nan
            for q in ex.quality
        ],
        index=ex.index,
        dtype=float,
    )


def margin_in_units(metric: str, points: float) -> float:
    """A margin of ``points`` of a metric in the metric's own units: a point of a 0-100 score (BLEU, ROUGE), a
    hundredth of an accuracy."""
    return points / 100 if metric in ("accuracy", "exact_match") else points


def separation(root_or_ex, run_or_task: str, task: str | None = None) -> tuple[float, str, int]:
    """(the target's mean per-query score minus the drafter alone's, the metric, n) on ``task``: paired per query on
    the task's quality column of the run (``separation(root, run, task)``: read from the run's records and curves)."""
    from specbench.arms import AUTOREGRESSIVE
    from specbench.pipelines.cascade_curves import ALONE

    if task is None:
        raise TypeError("separation(root, run, task)")
    root, run = root_or_ex, run_or_task
    from specbench.records import CURVES_CSV

    ex = load_examples(root, run)
    columns = task_columns(run_table(root, f"{run}/{CURVES_CSV}"))
    metric = columns[task]
    p = paired(ex, [AUTOREGRESSIVE, ALONE], task)
    d = (task_quality(p[AUTOREGRESSIVE], metric) - task_quality(p[ALONE], metric)).dropna()
    if d.empty:
        raise ValueError(f"no query of {task} scored by both the target and the drafter alone")
    return float(d.mean()), metric, len(d)


def paired(ex: pd.DataFrame, methods: list[str], task: str | None = None) -> dict[str, pd.DataFrame]:
    """``{method: its records}`` on the queries every one of ``methods`` ran (in ``task``; None or ``all``: every
    task), aligned by query id; a query whose records come from different timing processes (a resumed run)
    is left out, as the summary's speedups never pair two processes."""
    from specbench.pipelines.tables import ALL_TASKS

    sub = ex if task in (None, ALL_TASKS) else ex[ex.task == task]
    per = {m: sub[sub.method == m].set_index("query_id") for m in dict.fromkeys(methods)}
    if not per or any(p.empty for p in per.values()):
        return {m: p.iloc[:0] for m, p in per.items()}
    common = sorted(set.intersection(*(set(p.index) for p in per.values())), key=str)
    if "process" in sub:

        def one_process(q):
            procs = {str(p.at[q, "process"]) for p in per.values() if _present(p.at[q, "process"])}
            return len(procs) <= 1

        common = [q for q in common if one_process(q)]
    return {m: p.loc[common] for m, p in per.items()}


def _present(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))
