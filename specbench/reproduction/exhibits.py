"""The reproduced tables and figures: each a function of run directories under one root.

Every builder reads the files our commands write (``summary.csv`` of eval, ``summary.csv`` /
``alpha_sweep.csv`` / ``data_efficiency.csv`` of train-policy, ``convergence.csv``, ``curves.csv`` of
cascades), lays them out as the paper does (rows and columns named as in the paper, where it has
them), sets the published numbers beside ours and checks the paper's claim (``verdicts``): every speed
or quality comparison on the per-query records of its runs (``examples.jsonl``, :func:`load_examples`),
paired per query with a bootstrap interval; a claim whose data have only an aggregate form (train-policy's
replayed speedups) is kept and marked not judged, saying why. A
builder whose runs are missing is skipped and listed as not run. The run directories are the ones
``specbench reproduce`` writes (``plan.py``), the same for every profile; what differs between the
CPU-scale and the paper-scale runs (which drafter plays which part, which cascades runs exist, the
notes) is a ``Layout``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from specbench.errors import SpecbenchError
from specbench.pipelines.report import ALL_TASKS, ORACLE, pyplot
from specbench.reproduction import verdicts as V
from specbench.reproduction.published import Published, lookup

TASKS = ("translation", "summarization", "math", "chat", "code")
SPECIALISTS = {f"eagle_{t}": t for t in TASKS}
GENERALIST = "eagle_general"


@dataclass(frozen=True)
class MetaRun:
    """One MetaSD eval run: its directory, the pool's specialists (drafter -> its task) and generalist,
    and the paper's name for UCB-BD in the published table."""

    run: str
    key: str
    title: str
    specialists: dict[str, str]
    generalist: str | None
    ucb_row: str = ""
    setting: str = ""


@dataclass(frozen=True)
class CascadeRun:
    """One cascades run (``cascades/<name>``) and the quality axis its exhibit plots."""

    name: str
    title: str
    quality: str  # a column of cascade_points: agreement | rouge2_summarization | quality
    quality_label: str
    greedy: bool = False


PAPER_REWARD = ("the paper's: alpha * alignment (ROUGE-L of the drafter's own output to the target's) + (1 - alpha) * "
                "(1 - cost) (parameters relative to the largest arm), alpha 0.5.")
MEASURED_REWARD = ("measured speed (each arm's speedup on the query over the query's best arm), a labelled substitute for "
                   "the paper's alignment reward: the draft heads draft on the target's features and cannot generate "
                   "alone, so they have no ROUGE-L alignment to score.")


@dataclass(frozen=True)
class Layout:
    """What one profile's runs hold: the parts each drafter plays and the notes that name the models."""

    name: str
    scale: str  # figure titles: "CPU scale" | "paper scale"
    exhibits: tuple[str, ...]  # BUILDERS keys or a MetaRun's key, in report order
    huang_pair: dict[str, tuple[str, str]]  # Table 1: drafter -> (its task, the paper's row)
    huang_models: str
    alpha_arms: tuple[str, str]  # Fig. 2: (cheap, better aligned)
    alpha_note: str
    depth_note: str
    training_note: str
    metasd: tuple[MetaRun, ...]
    cascades: tuple[CascadeRun, ...]
    tasks: tuple[str, ...] | None = TASKS  # MetaSD columns (None: the run's own tasks, in its order)
    task_columns: dict[str, str] = field(default_factory=dict)  # our task -> the paper's column name
    languages: tuple[str, ...] = ()  # MetaSD multilingual runs: metasd/multilingual/<language>
    stream_note: str = ""  # how the task changes in the non-stationary run
    held_out: str = "the"  # how many held-out queries the live policy evals read ("16 per source", ...)
    table1_reward: str = PAPER_REWARD  # what Huang et al.'s policies train on, per table
    table4_reward: str = PAPER_REWARD
    table6_reward: str = PAPER_REWARD


@dataclass
class Exhibit:
    key: str  # "<paper>/<name>": where its files go
    title: str
    table: pd.DataFrame
    verdicts: list[V.Verdict]
    notes: str = ""
    runs: list[str] = field(default_factory=list)
    plot: Callable[[Path], None] | None = None


class NotRun(Exception):
    """A run an exhibit needs is not there (yet)."""


def _csv(root: Path, rel: str) -> pd.DataFrame:
    path = root / rel
    if not path.exists():
        raise NotRun(rel)
    return read_table(path)


def read_table(path: Path) -> pd.DataFrame:
    """A CSV our commands wrote; an empty (0-byte) or torn one (cut mid-line by a stopped run) is refused,
    naming the file and the step that writes it."""
    step = path.parent
    fix = (f"run its step again: delete {step / DONE} if it is there, then rerun `specbench reproduce` with the same "
           "options (the step resumes from its records and writes the file again; add --redo if it then names the "
           "steps that read it), or rerun the command that wrote the file into that directory")
    data = path.read_bytes()
    if not data.strip():
        raise SpecbenchError(f"{path} is empty ({len(data)} bytes): the run that writes it stopped before it finished",
                             fix)
    if not data.endswith(b"\n"):
        raise SpecbenchError(f"{path} is torn (its last line is cut off): the run that writes it stopped while "
                             "writing it", fix)
    try:
        return pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise SpecbenchError(f"{path} cannot be read as a table ({str(exc).strip().splitlines()[0]})", fix) from None


# ---------------------------------------------------------------- unfinished runs
DONE = ".done"  # what `specbench reproduce` leaves in a step's directory when the step finished (plan.DONE)
RECORDS = {"eval": ("examples.jsonl", "generations"), "cascades": ("examples.jsonl", "generations"),
           "collect": ("rows.jsonl", "collected queries")}


def _lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def _command_of(out: Path) -> str | None:
    """Which command wrote the run directory ``out``: from the records it holds."""
    for name, command in (("examples.jsonl", "eval"), ("rows.jsonl", "collect")):
        if (out / name).exists():
            if command == "eval" and (out / "config.yaml").exists():
                from omegaconf import OmegaConf

                try:
                    return "cascades" if "rules" in OmegaConf.load(out / "config.yaml") else "eval"
                except Exception:  # noqa: BLE001 - an unreadable config: counted as eval
                    return "eval"
            return command
    return None


def planned(out: Path, command: str | None) -> int | None:
    """How many generations (eval, cascades) or queries (collect) the run in ``out`` plans, from its
    ``config.yaml`` and its data files (None when that cannot be worked out without loading models)."""
    from omegaconf import OmegaConf

    from specbench.decoding.drafter import AUTOREGRESSIVE
    from specbench.tasks import load_dataset_config

    try:
        cfg = OmegaConf.load(out / "config.yaml")
        queries = load_dataset_config(cfg.dataset)
        if command == "collect":
            shard, shards = int(cfg.collect.shard), int(cfg.collect.num_shards)
            return sum(1 for i, _ in enumerate(queries) if i % shards == shard)
        if command == "cascades":
            from specbench.pipelines.cascades import variants

            tasks = set(cfg.get("tasks") or [])
            return sum(1 for q in queries if not tasks or q.task in tasks) * len(variants(cfg.rules, cfg.alphas))
        if command == "eval":
            from specbench.pipelines.methods import parse_methods
            from specbench.pipelines.session import turns_of

            max_turns = int(cfg.dataset.get("max_turns") or 1)
            pool = dict.fromkeys([AUTOREGRESSIVE, *(k for k, v in (cfg.pool.get("drafters") or {}).items() if v)])
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
    file, what = RECORDS.get(command, ("", "generations"))
    have = _lines(out / file) if file else 0
    if (out / DONE).exists():
        try:
            want = json.loads((out / DONE).read_text(encoding="utf-8")).get("records")
        except (ValueError, AttributeError, UnicodeDecodeError):
            want = None
        if isinstance(want, int) and file and have < want:
            return f"unfinished: {have} of {want} {what} ({file} holds fewer than the step finished with)"
        return None
    summary = out / "summary.md"
    stopped = summary.is_file() and "stopped early" in summary.read_text(encoding="utf-8", errors="replace")
    if not stopped and not (Path(root) / "reproduce.json").exists():
        return None  # not a reproduce root: run directories without .done are complete runs
    if not file:
        return f"unfinished: {run} has no {DONE} (its step stopped before it finished)"
    want = planned(out, command)
    return f"unfinished: {have} of {want} {what}" if want else f"unfinished: {have} {what}, the step did not finish"


def mark_unfinished(ex: Exhibit, root: Path) -> Exhibit:
    """An exhibit built on an unfinished run says so in its title and notes, and judges none of its claims."""
    found = [f"{run}: {why}" if run not in why else why for run in ex.runs if (why := unfinished(root, run))]
    if not found:
        return ex
    why = "; ".join(found)
    ex.title = f"{ex.title} ({why})"
    ex.verdicts = [V.unfinished(v, why) for v in ex.verdicts]
    ex.notes = (f"**Unfinished run** ({why}): the numbers are those of the finished part only, so no claim is judged "
                f"on them; rerun `specbench reproduce` to finish it. {ex.notes}")
    return ex


def _optional(root: Path, rel: str) -> pd.DataFrame:
    try:
        return _csv(root, rel)
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
    return {t: {m.split(":", 1)[1]: v for m, v in row.items() if m.startswith("fixed:")}
            for t, row in speeds(summary, value).items()}


def replayed(summary: pd.DataFrame) -> dict[str, float]:
    """train-policy's summary: ``{choice: speedup_replayed}`` (``policy``, ``always <arm>``, ...)."""
    if "speedup_replayed" not in summary:
        return {}
    return {str(c): float(s) for c, s in zip(summary.choice, summary.speedup_replayed)}


# ---------------------------------------------------------------- per-query records (what the verdicts judge)
EXAMPLE_FIELDS = ("query_id", "task", "method", "seconds", "new_tokens", "target_calls", "switches", "quality",
                  "process", "output_ids")
NOT_PAIRED = ("train-policy writes only aggregate replayed speedups (no per-query choice of the policy), so this "
              "cannot be paired per query")


def load_examples(root: Path, run: str, fields: tuple[str, ...] = EXAMPLE_FIELDS) -> pd.DataFrame:
    """The per-query records of the run ``root/run`` (its ``examples.jsonl``: one object per generation), one
    row per (query_id, method), the last record kept (as ``summarize`` does); empty when the file is absent. A
    torn last line (a stopped run) is skipped: ``mark_unfinished`` says the run is unfinished."""
    path = Path(root) / run / "examples.jsonl"
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


def _n_val(root: Path, run: str) -> int | None:
    """How many validation queries the train-policy run ``root/run`` judged on (its metrics.json), or None."""
    try:
        n = json.loads((Path(root) / run / "metrics.json").read_text(encoding="utf-8")).get("n_val")
    except (OSError, ValueError, AttributeError):
        return None
    return int(n) if isinstance(n, (int, float)) and n > 0 else None


def load_round_values(root: Path, run: str, methods: tuple[str, ...] | None = None,
                      fields: tuple[str, ...] = ("query_id", "task", "method", "round", "arm")) -> pd.DataFrame:
    """The per-round records (``rounds.jsonl``) of ``methods`` (None: every method) in ``root/run``, ``fields`` only."""
    path, rows = Path(root) / run / "rounds.jsonl", []
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


def with_oracle_examples(ex: pd.DataFrame) -> pd.DataFrame:
    """``ex`` plus the oracle's records: per task, a copy of the records of its fastest fixed drafter (total
    seconds on that task, as in the summary's oracle row; picked on the same queries, an upper bound)."""
    from specbench.pipelines.report import with_oracle

    return with_oracle(ex) if len(ex) else ex


def paired(ex: pd.DataFrame, methods: list[str], task: str | None = None) -> dict[str, pd.DataFrame]:
    """``{method: its records}`` on the queries every one of ``methods`` ran (in ``task``; None or ``all``: every
    task), aligned by query id; a query whose records come from different timing processes (a resumed run)
    is left out, as the summary's speedups never pair two processes."""
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


def _timed(p: pd.DataFrame) -> tuple[list[float], list[float]]:
    return list(p.seconds.astype(float)), list(p.new_tokens.astype(float))


def faster_on(ex: pd.DataFrame, claim: str, a: str, b: str, task: str | None = None, names: tuple[str, str] | None = None,
              threshold: float = 1.0, at_least: bool = False, run: str = "", **kw) -> V.Verdict:
    """``a`` faster than ``b`` (or at least ``threshold`` of its speed), paired per query of ``task``."""
    names = names or (_name(a), _name(b))
    if ex.empty:
        return V.missing(claim, f"per-query records ({run}/examples.jsonl)" if run else "per-query records",
                         f"speedup ratio {names[0]} / {names[1]}")
    p = paired(ex, [a, b], task)
    return V.faster(claim, _timed(p[a]), _timed(p[b]), names, threshold=threshold, at_least=at_least, **kw)


def _name(method: str) -> str:
    return method.split(":", 1)[1] if method.startswith("fixed:") else method


def fixed_methods(ex: pd.DataFrame, task: str | None = None) -> list[str]:
    sub = ex if task in (None, ALL_TASKS) else ex[ex.task == task]
    return [m for m in dict.fromkeys(sub.method) if str(m).startswith("fixed:")]


def fastest_on_own_task(ex: pd.DataFrame, own: dict[str, str], claim: str, run: str) -> V.Verdict:
    """On each task with a specialist (``own[drafter] = task``), the specialist is faster than every other
    fixed drafter of the run, each pair judged per query."""
    if ex.empty:
        return V.missing(claim, f"per-query records ({run}/examples.jsonl)", "speedup ratio")
    parts = [(f"{task}: {d} vs {_name(o)}", faster_on(ex, "", f"fixed:{d}", o, task))
             for d, task in own.items() for o in fixed_methods(ex, task) if o != f"fixed:{d}"]
    return V.all_of(claim, parts, "each part: speedup ratio specialist / other > 1")


def margin_over_mean(ex: pd.DataFrame, drafter: str, others: list[str], task: str, margin: float) -> V.Verdict:
    """``drafter``'s speedup over autoregressive decoding is at least ``1 + margin`` times the mean of ``others'``
    speedups, on the queries of ``task`` all of them ran."""
    from specbench.decoding.drafter import AUTOREGRESSIVE

    methods = [AUTOREGRESSIVE, drafter, *others]
    p = paired(ex, methods, task)
    cols = {}
    for i, m in enumerate(methods):
        cols[f"m{i}_s"], cols[f"m{i}_t"] = _timed(p[m])

    def stat(c):
        sp = [V.seconds_per_token(c["m0_s"], c["m0_t"]) / V.seconds_per_token(c[f"m{i}_s"], c[f"m{i}_t"])
              for i in range(1, len(methods))]
        return sp[0] / (sum(sp[1:]) / len(sp[1:]))

    return V.judge("", cols, stat, 1 + margin, f"speedup ratio {_name(drafter)} / mean of the others", at_least=True)


def mat_on(ex: pd.DataFrame, a: str, b: str, task: str) -> V.Verdict:
    """``a``'s MAT (new tokens per target call) above ``b``'s, paired per query of ``task``."""
    p = paired(ex, [a, b], task)
    cols = {"a_n": p[a].new_tokens, "a_c": p[a].target_calls, "b_n": p[b].new_tokens, "b_c": p[b].target_calls}
    stat = lambda c: V.ratio_of_sums("a_n", "a_c")(c) / V.ratio_of_sums("b_n", "b_c")(c)  # noqa: E731
    return V.judge("", {k: list(v.astype(float)) for k, v in cols.items()}, stat, 1.0,
                   f"MAT ratio {_name(a)} / {_name(b)}")


def with_published(table: pd.DataFrame, published: list[Published], paper: str, exhibit: str,
                   rows: dict[str, str], columns: list[str], aliases: dict[str, str] | None = None) -> pd.DataFrame:
    """Add ``<column> (paper)`` beside each of ``columns``: ``rows`` maps our row label -> the paper's row,
    ``aliases`` our column -> the paper's (default: the same name)."""
    out = table.copy()
    for col in columns:
        theirs = (aliases or {}).get(col, col)
        vals = [lookup(published, paper, exhibit, rows.get(label, ""), theirs) for label in out.iloc[:, 0]]
        out.insert(list(out.columns).index(col) + 1, f"{col} (paper)", vals)
    return out


def _figure(path: Path, draw: Callable, title: str, xlabel: str, ylabel: str, size=(6, 3.5), **axes) -> None:
    """One PNG: ``draw(ax)`` plots, then labels, ``axes`` (e.g. ``xscale="log"``, ``ylim=(0, 1)``) and a legend."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=size)
    draw(ax)
    ax.set(xlabel=xlabel, ylabel=ylabel, **axes)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- Huang et al.
TABLE1_QUALITY = {"translation": "bleu", "summarization": "rougeL"}


def huang_table1(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    summary = _csv(root, "huang/eval/summary.csv")
    sp = speeds(summary)
    rows = [(f"fixed:{d}", d, paper_row) for d, (_, paper_row) in lay.huang_pair.items()] + [("policy", "policy", "policy")]
    cells = {(r.task, r.method): r for r in summary.itertuples()}

    def extra(task: str, method: str) -> dict:
        """The acceptance and quality columns of one cell (quality: BLEU on translation, ROUGE-L on summarization)."""
        r = cells.get((task, method))
        metric = TABLE1_QUALITY.get(task, "")
        return {f"{task} acceptance": getattr(r, "acceptance_rate", math.nan) if r else math.nan,
                f"{task} {metric}": getattr(r, metric, math.nan) if r and metric else math.nan}

    table = pd.DataFrame([{"drafter": label, **{t: sp.get(t, {}).get(m, math.nan) for t in ("translation", "summarization")},
                           **{k: v for t in ("translation", "summarization") for k, v in extra(t, m).items()}}
                          for m, label, _ in rows])
    table = with_published(table, published, "huang", "table1", {label: p for _, label, p in rows},
                           ["translation", "summarization"])
    pair = {d: task for d, (task, _) in lay.huang_pair.items()}
    ex = load_examples(root, "huang/eval")
    single = {t: {d: v for d, v in drafter_speeds(summary).get(t, {}).items() if d in pair} for t in pair.values()}
    best = {t: max(v, key=v.get) for t, v in single.items() if v}  # the comparator: the best by its total
    fastest = V.all_of("each specialist speeds up its own task more than the other specialist does",
                       [(f"{task}: {d} vs {o}", faster_on(ex, "", f"fixed:{d}", f"fixed:{o}", task, run="huang/eval"))
                        for d, task in pair.items() for o in pair if o != d], "each part: speedup ratio > 1")
    within = V.all_of("the policy is within 5% of the best drafter on every task",
                      [(f"{task}: policy vs {d}", faster_on(ex, "", "policy", f"fixed:{d}", task, threshold=0.95,
                                                            at_least=True, run="huang/eval"))
                       for task, d in best.items()],
                      "each part: speedup ratio policy / best drafter of the task (by its total) >= 0.95")
    if not best:
        within = V.missing("the policy is within 5% of the best drafter on every task", "the specialists' rows",
                           "speedup ratio")
    notes = ("Speedup over autoregressive decoding on held-out rows (the policy's eval slice, disjoint from the "
             "collected queries), with each cell's acceptance rate and output quality (BLEU, ROUGE-L: greedy "
             "decoding is lossless, so every row's quality is the target's own). Paper: T5-large target with T5-small "
             f"(a generalist that translates well) and T5-small-XSum; ours: {lay.huang_models}. Reward: "
             f"{lay.table1_reward}")
    val = replayed(_optional(root, "huang/policy/summary.csv"))
    if val:
        notes += " Replayed on the validation queries of the collection: " + ", ".join(
            f"{k} {v:.3f}" for k, v in val.items() if not math.isnan(v)) + "."
    return Exhibit("huang/table1", "Huang et al., Table 1: each specialist on both tasks, and the policy", table,
                   [fastest, within], notes, ["huang/eval", "huang/policy"])


def huang_fig2(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    df = _csv(root, "huang/depth/alpha/alpha_sweep.csv")
    shares = [c for c in df.columns if c.startswith("share_")]
    arms = [c.removeprefix("share_") for c in shares]
    cheap, aligned = lay.alpha_arms
    lo, hi = df.loc[df.alpha.idxmin()], df.loc[df.alpha.idxmax()]
    claim = "the alpha sweep moves the choice from the cheap drafter (alpha 0) to the better-aligned one (alpha 1)"
    n_val = _n_val(root, "huang/depth/alpha")
    if f"share_{cheap}" not in df or f"share_{aligned}" not in df:
        verdict = V.missing(claim, f"shares of {cheap} and {aligned}")
    elif n_val is None:
        verdict = V.unpaired(claim, "the number of validation queries behind the shares is unknown (no n_val in "
                                    "huang/depth/alpha/metrics.json)", "share")
    else:
        # a share of n validation queries is k = share * n queries given that arm: the per-query hits
        def hits(share: float) -> list[float]:
            k = int(round(float(share) * n_val))
            return [1.0] * k + [0.0] * (n_val - k)

        verdict = V.all_of(claim, [
            (f"alpha {lo.alpha:g}: share of {cheap}", V.majority("", hits(lo[f"share_{cheap}"]), f"share of {cheap}")),
            (f"alpha {hi.alpha:g}: share of {aligned}", V.majority("", hits(hi[f"share_{aligned}"]), f"share of {aligned}")),
        ], "each part: a majority of the validation queries, share > 0.5")

    def plot(path: Path) -> None:
        def draw(ax):
            for a in arms:
                ax.plot(df.alpha, df[f"share_{a}"], marker="o", label=a)
        _figure(path, draw, f"Huang et al. Fig. 2 ({lay.scale}): choice vs alpha", "alpha (weight of alignment vs cost)",
                "share of validation queries")

    notes = ("Proxy reward r = alpha * alignment (ROUGE-L of the drafter's own output to the target's) + (1 - alpha) * "
             f"(1 - cost) (parameters relative to the largest arm); one policy per alpha. Arms: {lay.alpha_note}.")
    return Exhibit("huang/fig2", "Huang et al., Fig. 2: the alpha trade-off between a cheap and a better-aligned drafter",
                   df, [verdict], notes, ["huang/depth/collect", "huang/depth/alpha"], plot)


def huang_fig3(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    df = _csv(root, "huang/policy/data_efficiency.csv").sort_values("n_examples")
    first, last = df.iloc[0], df.iloc[-1]
    verdict = V.unpaired("more training queries give a higher speed than the fewest",
                         f"{NOT_PAIRED}; aggregates: {int(last.n_examples)} queries {last.speedup_replayed:.3f} vs "
                         f"{int(first.n_examples)} {first.speedup_replayed:.3f}", "speedup ratio")

    def plot(path: Path) -> None:
        def draw(ax):
            ax.plot(df.n_examples, df.speedup_replayed, marker="o", label="policy")
            if "oracle_speedup" in df:
                ax.plot(df.n_examples, df.oracle_speedup, ls="--", color="gray", label="per-query oracle")
        _figure(path, draw, f"Huang et al. Fig. 3 ({lay.scale}): speed vs training queries", "training queries (log scale)",
                "speedup (replayed, validation)", xscale="log")

    notes = ("Replayed speedup of the chosen arms' measured speculative runs on the same validation queries; "
             f"{lay.training_note}")
    return Exhibit("huang/fig3", "Huang et al., Fig. 3: speed against the number of training queries", df, [verdict],
                   notes, ["huang/policy"], plot)


def best_fixed(summary: pd.DataFrame, task: str = ALL_TASKS) -> str | None:
    """The fixed drafter with the highest speedup of the eval ``summary`` on ``task`` (by its total), or None."""
    single = drafter_speeds(summary).get(task, {})
    return f"fixed:{max(single, key=single.get)}" if single else None


def huang_table4(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    run = "huang/math/eval"
    summary = _csv(root, f"{run}/summary.csv")
    live = speeds(summary).get(ALL_TASKS, {})
    sp = replayed(_optional(root, "huang/math/policy/summary.csv"))
    alone = {m.split(":", 1)[1]: v for m, v in live.items() if m.startswith("fixed:")}
    best = best_fixed(summary)
    table = pd.DataFrame([{"method": f"{a} alone", "speedup": v, "replayed": sp.get(f"always {a}", math.nan)}
                          for a, v in alone.items()] +
                         [{"method": "drafting alone (best drafter)", "speedup": live.get(best, math.nan) if best else math.nan,
                           "replayed": max((v for k, v in sp.items() if k.startswith("always ")
                                            and k != "always autoregressive"), default=math.nan)},
                          {"method": "policy with the autoregressive arm", "speedup": live.get("policy", math.nan),
                           "replayed": sp.get("policy", math.nan)}])
    table = with_published(table, published, "huang", "table4",
                           {"drafting alone (best drafter)": "drafting alone",
                            "policy with the autoregressive arm": "policy with the autoregressive arm"}, ["speedup"])
    ex = load_examples(root, run)
    from specbench.decoding.drafter import AUTOREGRESSIVE

    claim = "with the autoregressive arm the policy is faster than drafting alone (the best drafter)"
    verdicts = [faster_on(ex, claim, "policy", best, names=("policy", _name(best)), run=run) if best else
                V.missing(claim, f"the fixed drafters' rows ({run}/summary.csv)", "speedup ratio"),
                faster_on(ex, "the policy holds at least 0.95x of autoregressive speed", "policy", AUTOREGRESSIVE,
                          threshold=0.95, at_least=True, run=run)]
    return Exhibit("huang/table4", "Huang et al., Table 4: math, with the autoregressive arm", table, verdicts,
                   f"GSM8K test rows: speedup of the policy evaluated live on {lay.held_out} held-out rows (after the "
                   "collected ones), beside each drafter alone in the same run; `replayed`: the collection's "
                   f"validation queries replayed (train-policy). Reward: {lay.table4_reward}",
                   ["huang/math/collect", "huang/math/policy", run])


def huang_table6(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    without_run, with_run = "huang/depth/eval_without_ar", "huang/depth/eval_with_ar"
    without_s, with_s = _csv(root, f"{without_run}/summary.csv"), _csv(root, f"{with_run}/summary.csv")
    live = speeds(without_s).get(ALL_TASKS, {})
    without = replayed(_optional(root, "huang/depth/without_ar/summary.csv"))
    with_ar = replayed(_optional(root, "huang/depth/with_ar/summary.csv"))
    table = pd.DataFrame([{"method": f"{m.split(':', 1)[1]} alone", "speedup": v,
                           "replayed": with_ar.get(f"always {m.split(':', 1)[1]}", math.nan)}
                          for m, v in live.items() if m.startswith("fixed:")] +
                         [{"method": "policy without the autoregressive arm", "speedup": live.get("policy", math.nan),
                           "replayed": without.get("policy", math.nan)},
                          {"method": "policy with the autoregressive arm",
                           "speedup": speeds(with_s).get(ALL_TASKS, {}).get("policy", math.nan),
                           "replayed": with_ar.get("policy", math.nan)}])
    claim = "adding the autoregressive arm makes the policy faster"
    verdict = relative_faster(claim, load_examples(root, with_run), load_examples(root, without_run), "policy",
                              ("with the AR arm", "without"), (with_run, without_run))
    return Exhibit("huang/table6", "Huang et al., Table 6: drafters at several depths, with and without the autoregressive arm",
                   table, [verdict],
                   f"{lay.depth_note}. Each policy evaluated live on {lay.held_out} held-out rows, each run with its own "
                   "autoregressive baseline (the two runs are separate processes, so the verdict compares each policy's "
                   "per-query speedup over its own run's autoregressive decoding of the same query); `replayed`: the "
                   f"collection's validation queries replayed. Reward: {lay.table6_reward}",
                   ["huang/depth/collect", "huang/depth/without_ar", "huang/depth/with_ar", without_run, with_run])


def relative_faster(claim: str, ex_a: pd.DataFrame, ex_b: pd.DataFrame, method: str, names: tuple[str, str],
                    runs: tuple[str, str]) -> V.Verdict:
    """``method`` of run A faster than ``method`` of run B, where A and B are separate processes: each query's
    speedup over its own run's autoregressive decoding of it (paired within its run), the ratio of the two
    speedups over the queries both runs hold, with the bootstrap over those queries."""
    from specbench.decoding.drafter import AUTOREGRESSIVE

    label = f"speedup ratio {names[0]} / {names[1]} (each over its run's autoregressive)"
    if ex_a.empty or ex_b.empty:
        return V.missing(claim, f"per-query records ({runs[0] if ex_a.empty else runs[1]}/examples.jsonl)", label)
    pa, pb = paired(ex_a, [method, AUTOREGRESSIVE]), paired(ex_b, [method, AUTOREGRESSIVE])
    common = sorted(set(pa[method].index) & set(pb[method].index), key=str)
    cols = {}
    for tag, p in (("a", pa), ("b", pb)):
        for m, short in ((method, "m"), (AUTOREGRESSIVE, "ar")):
            cols[f"{tag}{short}_s"], cols[f"{tag}{short}_t"] = _timed(p[m].loc[common])

    def stat(c):
        sp = lambda t: (V.seconds_per_token(c[f"{t}ar_s"], c[f"{t}ar_t"])  # noqa: E731
                        / V.seconds_per_token(c[f"{t}m_s"], c[f"{t}m_t"]))
        return sp("a") / sp("b")

    return V.judge(claim, cols, stat, 1.0, label)


# ---------------------------------------------------------------- MetaSD
METASD_ROWS = {"random-query": "random drafter per query", "random": "uniform mixture per round", "exp3-bd": "EXP3",
               "halving-bd": "sequential halving", "hedge-bd": "Hedge (full information)", "ucb-be": "UCB-BE",
               "ucb-bd": "UCB-BD", "ucb-bd-fi": "UCB-BD, full information", "ucb-switch-bd": "UCB-BD with a switching cost",
               "etc-bd": "explore-then-commit", ORACLE: "oracle (best single drafter per task)"}
UCB, UCB_BE, UCB_FI, UCB_SWITCH, ETC, UNIFORM = "ucb-bd", "ucb-be", "ucb-bd-fi", "ucb-switch-bd", "etc-bd", "random"
BANDITS = ("exp3-bd", "halving-bd")  # the bandit-feedback alternatives MetaSD sets UCB against
FIRST_ROUNDS = 20  # convergence: the share of a query's first rounds on its task's oracle arm


def _tasks(sp: dict, lay: Layout) -> list[str]:
    order = lay.tasks if lay.tasks is not None else [t for t in sp if t != ALL_TASKS]
    return [t for t in order if t in sp]


BEST_ROW = "best single drafter"  # the paper's row name for it (published.yaml)


def metasd_table(root: Path, published: list[Published], lay: Layout, meta: MetaRun) -> Exhibit:
    summary = _csv(root, f"{meta.run}/summary.csv")
    sp = speeds(summary)
    tasks = _tasks(sp, lay) + [ALL_TASKS]
    methods = [m for m in dict.fromkeys(summary.method) if m != "autoregressive"]
    label = lambda m: m.split(":", 1)[1] if m.startswith("fixed:") else METASD_ROWS.get(m, m)  # noqa: E731
    table = pd.DataFrame([{"method": label(m), **{t: sp[t].get(m, math.nan) for t in tasks}} for m in methods])
    ds = drafter_speeds(summary)
    best_row = {"method": "best single drafter", **{t: max(ds.get(t, {}).values(), default=math.nan) for t in tasks}}
    table = pd.concat([table, pd.DataFrame([best_row])], ignore_index=True)
    pub = [p for p in published if p.paper == "metasd" and p.exhibit == "main" and p.row in (meta.ucb_row, BEST_ROW)]
    if meta.ucb_row and pub:  # the paper's UCB and best-single rows beside ours, on the columns it publishes
        cols = [t for t in tasks if any(p.column == lay.task_columns.get(t, t) for p in pub)]
        table = with_published(table, published, "metasd", "main",
                               {"UCB-BD": meta.ucb_row, "best single drafter": BEST_ROW}, cols, lay.task_columns)
    own = {d: t for d, t in meta.specialists.items() if any(d in ds.get(task, {}) for task in sp)}
    shown = [p for p in published if p.paper == "metasd" and p.exhibit == "main"]
    notes = (f"Speedup over autoregressive decoding, {meta.setting} (oracle: the best single drafter per task, measured "
             "in the same run). Published (Vicuna-7B on an A100): " +
             "; ".join(f"{p.row} on {p.column} {p.value:.3f} ({p.setting.split(':')[0]})" for p in shown) + ".")
    ex = load_examples(root, meta.run)
    exo = with_oracle_examples(ex)
    singles = fixed_methods(ex)
    verdicts = [
        faster_on(exo, "UCB-BD reaches at least 0.95 of the per-task oracle on the mixed stream", "ucb-bd", ORACLE,
                  threshold=0.95, at_least=True, run=meta.run),
        V.all_of("UCB-BD is above the best single drafter on the mixed stream",
                 [(f"vs {_name(d)}", faster_on(ex, "", "ucb-bd", d)) for d in singles],
                 "each part: speedup ratio UCB-BD / that drafter > 1 (above every single drafter)")
        if singles else V.missing("UCB-BD is above the best single drafter on the mixed stream",
                                  f"per-query records of single drafters ({meta.run}/examples.jsonl)", "speedup ratio"),
        fastest_on_own_task(ex, own, "each specialist is the fastest single drafter on its own task", meta.run),
    ]
    if meta.generalist:
        margin, claim = 0.15, ("each specialist is at least 15% faster on its task than the other specialists' mean "
                               "and the generalist")
        parts = []
        for d, task in own.items():
            others = [f"fixed:{o}" for o in own if o != d and f"fixed:{o}" in fixed_methods(ex, task)]
            if others:
                parts.append((f"{task}: vs the others' mean", margin_over_mean(ex, f"fixed:{d}", others, task, margin)))
            parts.append((f"{task}: vs {meta.generalist}", faster_on(ex, "", f"fixed:{d}", f"fixed:{meta.generalist}",
                                                                     task, threshold=1 + margin, at_least=True)))
        verdicts.append(V.all_of(claim, parts, "each part: ratio >= 1.15") if not ex.empty
                        else V.missing(claim, f"per-query records ({meta.run}/examples.jsonl)", "speedup ratio"))
    return Exhibit(meta.key, meta.title, table, verdicts, notes, [meta.run])


def metasd_heads(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    """The specialists' own table: acceptance and MAT of every specialist on every task."""
    meta = lay.metasd[0]
    summary = _csv(root, f"{meta.run}/summary.csv")
    mat, acc = drafter_speeds(summary, "mat"), drafter_speeds(summary, "acceptance_rate")
    tasks = _tasks(mat, lay)
    pool = [*meta.specialists, *([meta.generalist] if meta.generalist else [])]
    heads = [d for d in pool if any(d in mat.get(t, {}) for t in tasks)]
    table = pd.DataFrame([{"task": t, **{h: f"{acc[t].get(h, math.nan):.2f} / {mat[t].get(h, math.nan):.2f}" for h in heads}}
                          for t in tasks])
    own = {d: t for d, t in meta.specialists.items() if d in heads}
    ex = load_examples(root, meta.run)
    claim = "each specialist has the highest MAT among the specialists on its own task"
    if ex.empty:
        verdicts = [V.missing(claim, f"per-query records ({meta.run}/examples.jsonl)", "MAT ratio")]
    else:  # the specialists only: the generalist has its own line
        verdicts = [V.all_of(claim, [(f"{task}: {d} vs {o}", mat_on(ex, f"fixed:{d}", f"fixed:{o}", task))
                                     for d, task in own.items() for o in own
                                     if o != d and f"fixed:{o}" in fixed_methods(ex, task)],
                             "each part: MAT ratio specialist / other specialist > 1")]
        if meta.generalist and meta.generalist in heads:
            verdicts.append(V.all_of(f"each specialist has a higher MAT than the generalist ({meta.generalist}) on its "
                                     "own task",
                                     [(f"{task}: {d} vs {meta.generalist}",
                                       mat_on(ex, f"fixed:{d}", f"fixed:{meta.generalist}", task)) for d, task in own.items()],
                                     "each part: MAT ratio specialist / generalist > 1"))
    return Exhibit("metasd/heads", "Specialist drafters: acceptance rate / MAT of every specialist on every task", table,
                   verdicts, "From the MetaSD run's single-drafter rows (greedy); verdicts on the per-query MAT "
                   "(new tokens / target calls) of the same queries.", [meta.run])


def early_shares(root: Path, run: str, methods: tuple[str, ...], first_rounds: int = FIRST_ROUNDS) -> pd.DataFrame:
    """Per query (rows) and method (columns): the share of the query's first ``first_rounds`` rounds in which the
    method played its task's oracle arm (the fastest fixed drafter of the task in the run); only the queries every
    one of ``methods`` has rounds for."""
    from specbench.pipelines.report import oracle_arms

    ex = load_examples(root, run, ("query_id", "task", "method", "seconds", "new_tokens"))
    arms = {t: m.split(":", 1)[1] for t, m in oracle_arms(ex).items()} if len(ex) else {}
    rounds = load_rounds(root, run, methods) if arms else pd.DataFrame()
    if rounds.empty:
        return pd.DataFrame(columns=list(methods))
    early = rounds[(rounds["round"] < first_rounds) & rounds.task.isin(arms)]
    early = early.assign(hit=(early.arm == early.task.map(arms)).astype(float))
    share = early.groupby(["method", "query_id"]).hit.mean().unstack(0)
    return share.dropna(subset=[m for m in methods if m in share]) if len(share) else share


def sooner(root: Path, run: str, claim: str, a: str, b: str, first_rounds: int = FIRST_ROUNDS, **kw) -> V.Verdict:
    """``a`` plays its task's oracle arm in more of a query's first rounds than ``b``, paired per query."""
    names = (METASD_ROWS.get(a, a), METASD_ROWS.get(b, b))
    label = f"share difference {names[0]} - {names[1]}"
    share = early_shares(root, run, (a, b), first_rounds)
    if not {a, b} <= set(share.columns):
        return V.missing(claim, f"per-query rounds of {names[0]} and {names[1]} ({run}/rounds.jsonl) or the oracle's "
                                f"arms ({run}/examples.jsonl)", label)
    return V.greater_mean(claim, list(share[a]), list(share[b]), label,
                          detail=f"per query: share of its first {first_rounds} rounds on its task's oracle arm", **kw)


def metasd_convergence(root: Path, published: list[Published], lay: Layout, first_rounds: int = FIRST_ROUNDS) -> Exhibit:
    conv = _csv(root, "metasd/eval/convergence.csv")
    early = conv[conv["round"] < first_rounds].groupby("method").share.mean()
    table = early.rename("share of the first rounds on the oracle's arm").reset_index()

    def plot(path: Path) -> None:
        def draw(ax):
            for m in (UCB, UCB_BE):
                sub = conv[(conv.method == m) & (conv["round"] < 40)]
                ax.plot(sub["round"], sub.share, label=METASD_ROWS.get(m, m))
        _figure(path, draw, f"MetaSD convergence ({lay.scale}): BD vs BE", "round within a query",
                "share playing the oracle's arm", ylim=(0, 1.02))

    claim = f"BD reaches the best arm sooner than BE (share on it over the first {first_rounds} rounds)"
    return Exhibit("metasd/convergence", "MetaSD, convergence: Block Divergence against Block Efficiency", table,
                   [sooner(root, "metasd/eval", claim, UCB, UCB_BE, first_rounds)],
                   "Share of rounds, by round index within a query, in which the selector played its task's oracle arm.",
                   ["metasd/eval"], plot)


def metasd_bandits(root: Path, published: list[Published], lay: Layout, first_rounds: int = FIRST_ROUNDS) -> Exhibit:
    """UCB-BD against EXP3, sequential halving and the static uniform mixture: speed and convergence."""
    run = "metasd/eval"
    summary = _csv(root, f"{run}/summary.csv")
    alls = speeds(summary).get(ALL_TASKS, {})
    shown = [m for m in (UCB, *BANDITS, UNIFORM) if m in alls]
    share = early_shares(root, run, tuple(shown), first_rounds)
    table = pd.DataFrame([{"method": METASD_ROWS.get(m, m), "speedup": alls[m],
                           f"share of the first {first_rounds} rounds on the oracle arm":
                               float(share[m].mean()) if m in share else math.nan} for m in shown])
    ex = load_examples(root, run)
    level = V.bonferroni(len(BANDITS))
    name = lambda m: METASD_ROWS.get(m, m)  # noqa: E731
    verdicts = [
        V.all_of("UCB-BD is faster than EXP3 and sequential halving",
                 [(name(b), faster_on(ex, "", UCB, b, names=(name(UCB), name(b)), level=level, run=run))
                  for b in BANDITS if b in alls],
                 f"each part: speedup ratio > 1, at level {level:.1%} (Bonferroni over the two)"),
        V.all_of(f"UCB-BD reaches the best arm sooner than EXP3 and sequential halving (first {first_rounds} rounds)",
                 [(name(b), sooner(root, run, "", UCB, b, first_rounds, level=level)) for b in BANDITS if b in alls],
                 f"each part: share difference > 0, at level {level:.1%} (Bonferroni over the two)"),
        faster_on(ex, "UCB-BD is faster than the static uniform mixture (a uniformly random drafter every round)", UCB,
                  UNIFORM, names=(name(UCB), name(UNIFORM)), run=run),
    ]
    return Exhibit("metasd/bandits", "MetaSD, bandit algorithms: UCB against EXP3, sequential halving and the uniform "
                   "mixture", table, verdicts,
                   "The main table's mixed stream: every selector restarts on each query (bandit feedback: only the "
                   "played drafter's reward is observed). Shares: per query, the share of its first rounds on its "
                   "task's oracle arm (the fastest single drafter of the task in this run), averaged over queries.",
                   [run])


def metasd_variance(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    """The per-round variance of the two rewards on the same rounds: BD against BE (MetaSD: BD is denser, so lower)."""
    run = "metasd/eval"
    rounds = load_round_values(root, run, None, ("query_id", "task", "method", "round", "drafted", "be", "bd"))
    if rounds.empty and not (Path(root) / run / "rounds.jsonl").exists():
        raise NotRun(f"{run}/rounds.jsonl")
    drafting = rounds[rounds.method.astype(str).str.startswith("fixed:") & (pd.to_numeric(rounds.drafted) > 0)]
    drafting = drafting.assign(be=pd.to_numeric(drafting.be), bd=pd.to_numeric(drafting.bd))
    var = drafting.groupby(["query_id", "method"])[["be", "bd"]].var(ddof=1).dropna()
    per_query = var.groupby("query_id").mean()  # each query: the mean over the fixed drafters of their variances
    by_drafter = var.groupby("method").mean().reset_index()
    by_drafter["method"] = by_drafter.method.map(_name)
    table = by_drafter.rename(columns={"method": "drafter", "be": "variance of BE per round",
                                       "bd": "variance of BD per round"})
    claim = "Block Divergence varies less from round to round than Block Efficiency (on the same rounds)"
    label = "variance difference BE - BD"
    verdict = (V.greater_mean(claim, list(per_query.be), list(per_query.bd), label,
                              detail="per query: the mean over the single drafters of the variance of each reward over "
                                     "the query's drafting rounds (both rewards in [0, 1])")
               if len(per_query) else V.missing(claim, f"drafting rounds of single drafters ({run}/rounds.jsonl)", label))
    return Exhibit("metasd/variance", "MetaSD, reward variance: Block Divergence against Block Efficiency", table,
                   [verdict],
                   "Every drafting round of every single drafter on the main table's stream carries both rewards "
                   "(rounds.jsonl: be = accepted / N_max, bd = the mean of 1 - TV(p, q) over the drafted positions), so the "
                   "two are compared on exactly the same rounds.", [run])


def metasd_full_info(root: Path, published: list[Published], lay: Layout, first_rounds: int = FIRST_ROUNDS) -> Exhibit:
    """Every head scored on every round (full information) against bandit feedback."""
    run = "metasd/eval"
    summary = _csv(root, f"{run}/summary.csv")
    alls = speeds(summary).get(ALL_TASKS, {})
    shown = [m for m in (UCB, UCB_FI, "hedge-bd") if m in alls]
    share = early_shares(root, run, tuple(shown), first_rounds)
    rows = summary[(summary.task == ALL_TASKS) & summary.method.isin(shown)].set_index("method")
    table = pd.DataFrame([{"method": METASD_ROWS.get(m, m), "speedup": alls[m], "MAT": float(rows.at[m, "mat"]),
                           f"share of the first {first_rounds} rounds on the oracle arm":
                               float(share[m].mean()) if m in share else math.nan} for m in shown])
    ex = load_examples(root, run)
    names = (METASD_ROWS[UCB_FI], METASD_ROWS[UCB])
    verdicts = [sooner(root, run, f"full information reaches the best arm sooner than bandit feedback (first "
                                  f"{first_rounds} rounds)", UCB_FI, UCB, first_rounds),
                faster_on(ex, "full information is faster than bandit feedback", UCB_FI, UCB, names=names, run=run)]
    return Exhibit("metasd/full_info", "Full information for heads (every head scored on every round) against bandit "
                   "feedback", table, verdicts,
                   "UCB-BD with full information: after each verification every head that was not played replays the "
                   "played draft from the target's features (no target call) and its Block Divergence is observed; "
                   "Hedge needs those observations too. The replays cost head forwards on every round, which the "
                   "speed verdict counts.", [run])


def metasd_switching(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    summary = _csv(root, "metasd/eval/summary.csv")
    shown = [m for m in (UCB, UCB_SWITCH, ETC) if m in set(summary.method)]
    rows = summary[(summary.task == ALL_TASKS) & summary.method.isin(shown)]
    table = rows[["method", "speedup", "switches", "mat"]].reset_index(drop=True)
    table["method"] = table.method.map(lambda m: METASD_ROWS.get(m, m))
    ex = load_examples(root, "metasd/eval")
    name = lambda m: METASD_ROWS.get(m, m)  # noqa: E731

    def fewer(claim: str, a: str, b: str) -> V.Verdict:
        """``a`` switches drafters fewer times per query than ``b``."""
        label = f"switches per query, {name(b)} - {name(a)}"
        if ex.empty or not {a, b} <= set(ex.method):
            return V.missing(claim, f"per-query records of {name(a)} and {name(b)} (metasd/eval/examples.jsonl)", label)
        p = paired(ex, [a, b])
        return V.greater_mean(claim, list(p[b].switches.astype(float)), list(p[a].switches.astype(float)), label)

    def keeps(claim: str, a: str) -> V.Verdict:
        if ex.empty or not {a, UCB} <= set(ex.method):
            return V.missing(claim, f"per-query records of {name(a)} and UCB-BD (metasd/eval/examples.jsonl)",
                             "speedup ratio")
        p = paired(ex, [a, UCB])
        return V.non_inferior(claim, _timed(p[a]), _timed(p[UCB]), 0.03, (name(a), name(UCB)))

    verdicts = [fewer("the switching cost cuts drafter switches", UCB_SWITCH, UCB),
                keeps("the switching-cost variant keeps UCB-BD's speed", UCB_SWITCH),
                fewer("explore-then-commit switches less than UCB-BD with the switching penalty", ETC, UCB_SWITCH),
                keeps("explore-then-commit keeps UCB-BD's speed", ETC)]
    return Exhibit("metasd/switching", "MetaSD, switching costs: the UCB penalty and explore-then-commit", table,
                   verdicts,
                   "Whole mixed stream. switches: drafter changes between consecutive rounds, summed over queries. "
                   "UCB-BD with a switching cost subtracts the cost from the index of every drafter but the current one; "
                   "explore-then-commit (the paper's algorithm for switching costs) plays each drafter a few rounds, "
                   "then commits to the best.", ["metasd/eval"])


def metasd_stream(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    summary = _csv(root, "metasd/stream/summary.csv")
    sp = speeds(summary)
    tasks = _tasks(sp, lay) + [ALL_TASKS]
    methods = [m for m in ("ucb-bd", "ducb-bd", "swucb-bd") if m in sp.get(ALL_TASKS, {})]
    names = {"ucb-bd": "UCB", "ducb-bd": "D-UCB", "swucb-bd": "SW-UCB"}
    table = pd.DataFrame([{"method": names[m], **{t: sp[t].get(m, math.nan) for t in tasks}} for m in methods])
    ex = load_examples(root, "metasd/stream")
    claim = "D-UCB or SW-UCB is above UCB when the task changes under the selector"
    level = V.bonferroni(2)
    verdict = (V.any_of(claim, [(names[m], faster_on(ex, "", m, "ucb-bd", names=(names[m], "UCB"), level=level))
                               for m in ("ducb-bd", "swucb-bd") if m in set(ex.method)],
                        f"each part: speedup ratio > 1 at level {level:.1%} (Bonferroni over the two alternatives)")
               if len(ex) else V.missing(claim, "per-query records (metasd/stream/examples.jsonl)", "speedup ratio"))
    return Exhibit("metasd/stream", "MetaSD, non-stationary stream: discounted and sliding-window UCB against UCB", table,
                   [verdict],
                   f"{lay.stream_note} The selectors' statistics carry over from turn to turn (carry_over), so the "
                   "best drafter changes under them at each task boundary.", ["metasd/stream"])


def metasd_multilingual(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    """One row per source language: its own drafter, the best single drafter, UCB-BD and the oracle."""
    if not lay.languages:
        raise NotRun("metasd/multilingual/<language>/summary.csv")
    rows, ucb, oracle = [], {}, {}
    for lang in lay.languages:
        summary = _csv(root, f"metasd/multilingual/{lang}/summary.csv")
        alls = speeds(summary).get(ALL_TASKS, {})
        single = drafter_speeds(summary).get(ALL_TASKS, {})
        best = max(single, key=single.get) if single else ""
        ucb[lang], oracle[lang] = alls.get("ucb-bd", math.nan), alls.get(ORACLE, math.nan)
        rows.append({"source language": lang, "own drafter": single.get(lang, math.nan),
                     "best single drafter": f"{best} {single.get(best, math.nan):.3f}",
                     "UCB-BD": ucb[lang], "oracle": oracle[lang]})
    return Exhibit("metasd/multilingual", "MetaSD, multilingual: one drafter per source language, translating into English",
                   pd.DataFrame(rows),
                   [V.all_of("UCB-BD is within 5% of the oracle for every source language",
                             [(lang, faster_on(with_oracle_examples(load_examples(root, f"metasd/multilingual/{lang}")), "",
                                               "ucb-bd", ORACLE, threshold=0.95, at_least=True,
                                               run=f"metasd/multilingual/{lang}")) for lang in lay.languages],
                             "each part: speedup ratio UCB-BD / oracle >= 0.95")],
                   "One run per source language (its test split); the pool holds one 68M drafter per source language.",
                   [f"metasd/multilingual/{lang}" for lang in lay.languages])


# ---------------------------------------------------------------- Spec-Bench
SPEC_BENCH_ROWS = {"vicuna_68m": "SpS (vicuna-68m)", "prompt_lookup": "prompt lookup", "eagle": "EAGLE"}


def spec_bench_leaderboard(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    summary = _csv(root, "spec_bench/eval/summary.csv")
    ds = drafter_speeds(summary)
    tasks = [t for t in ds if t != ALL_TASKS]
    table = pd.DataFrame([{"method": SPEC_BENCH_ROWS.get(d, d), "speedup": v,
                           **{t: ds[t].get(d, math.nan) for t in tasks}} for d, v in ds.get(ALL_TASKS, {}).items()])
    table = with_published(table, published, "spec_bench", "leaderboard", {r: r for r in SPEC_BENCH_ROWS.values()},
                           ["speedup"])
    ex = load_examples(root, "spec_bench/eval")
    claim = "EAGLE is the fastest of the reference drafters, as on the leaderboard"
    verdict = (V.all_of(claim, [(f"vs {_name(d)}", faster_on(ex, "", "fixed:eagle", d)) for d in fixed_methods(ex)
                                if d != "fixed:eagle"], "each part: speedup ratio EAGLE / that drafter > 1")
               if "fixed:eagle" in set(ex.method) else
               V.missing(claim, "per-query records of EAGLE (spec_bench/eval/examples.jsonl)", "speedup ratio"))
    return Exhibit("spec_bench/leaderboard", "Spec-Bench reference rows: each drafter alone on question.jsonl", table,
                   [verdict],
                   "Speedup over autoregressive decoding on every question and turn of Spec-Bench's question.jsonl "
                   "(greedy, 1024 new tokens). Our drafters draft a chain of draft_length tokens; Spec-Bench's SpS uses "
                   "Hugging Face's adaptive assistant length and EAGLE a tree, so equal numbers are not expected.",
                   ["spec_bench/eval"])


# ---------------------------------------------------------------- speculative cascades
def cascade_points(curves: pd.DataFrame) -> pd.DataFrame:
    """One point per method over every task: mean speedup, mean agreement with the target (tokens), the
    task metric, and ROUGE-2 on summarization."""
    g = curves.groupby(["method", "rule", "alpha"], dropna=False)
    out = g.agg(speedup=("speedup", "mean"), agreement=("agreement_tokens", "mean"), quality=("quality", "mean")).reset_index()
    summ = curves[curves.task == "summarization"].set_index("method")
    out["rouge2_summarization"] = out.method.map(summ["quality"]) if len(summ) else math.nan
    return out


def cascades(root: Path, published: list[Published], lay: Layout, run: CascadeRun) -> Exhibit:
    curves = _csv(root, f"cascades/{run.name}/curves.csv")
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
        _figure(path, draw, f"Speculative cascades ({lay.scale}, {run.name}): quality vs speed",
                "speedup over autoregressive (mean over tasks)", run.quality_label, size=(6.5, 4))

    notes = f"Quality axis (the verdict and the figure): {run.quality_label}. Plain SD is lossless."
    if run.greedy:
        notes += (" Under greedy decoding lossy SD is plain SD for alpha < 1 and the drafter alone at alpha 1, so those "
                  "two rows are its points.")
    notes += (" Verdicts: paired per query (each rule point against each baseline point on the same queries), "
              "faster with the speedup ratio's interval above 1 and at equal quality, i.e. the interval of the mean "
              "per-query quality difference above minus the stated margin; the level of each pair is "
              "Bonferroni-corrected over the pairs picked from.")
    return Exhibit(f"cascades/{run.name}", f"Speculative cascades, quality against speedup ({run.title})", pts,
                   cascade_verdicts(load_examples(root, f"cascades/{run.name}"), run), notes,
                   [f"cascades/{run.name}"], plot)


# the stated equal-quality margin per quality axis: a rule point is "at equal quality" when the interval of its
# mean per-query quality difference to the baseline lies above minus this (ROUGE-2 / BLEU points as in the
# cascades command's own tolerance; agreement: a share of token positions)
CASCADE_MARGINS = {"agreement": 0.05, "rouge2_summarization": 1.0}
SEQUENTIAL = ("the runs hold no sequential cascade (whole-query deferral from the drafter to the target): "
              "`specbench cascades` runs autoregressive decoding, the drafter alone, plain SD and the token-level rules")


def cascade_quality(ex: pd.DataFrame, run: CascadeRun) -> tuple[pd.Series | None, float, str]:
    """(per-record quality on ``run``'s axis, indexed like ``ex``; its equal-quality margin; why None)."""
    from specbench.decoding.drafter import AUTOREGRESSIVE
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
        out.append(V.missing(claim, f"per-query records (cascades/{run.name}/examples.jsonl)", label))
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
                    speed = V.faster("", _timed(p[r]), _timed(p[b]), (r, b), level=level)
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



BUILDERS: dict[str, Callable[[Path, list[Published], Layout], Exhibit]] = {
    "huang/table1": huang_table1, "huang/fig2": huang_fig2, "huang/fig3": huang_fig3, "huang/table4": huang_table4,
    "huang/table6": huang_table6,
    "metasd/heads": metasd_heads, "metasd/bandits": metasd_bandits, "metasd/variance": metasd_variance,
    "metasd/full_info": metasd_full_info,
    "metasd/convergence": metasd_convergence, "metasd/switching": metasd_switching, "metasd/stream": metasd_stream,
    "metasd/multilingual": metasd_multilingual, "spec_bench/leaderboard": spec_bench_leaderboard,
}


def builders(lay: Layout) -> list[Callable[[Path, list[Published]], Exhibit]]:
    """The layout's exhibits in report order (a MetaSD run's table under its key), then one per cascades
    run: each ``(root, published) -> Exhibit``."""
    tables = {meta.key: meta for meta in lay.metasd}

    def one(key: str) -> Callable[[Path, list[Published]], Exhibit]:
        if key in tables:
            return lambda root, pub: metasd_table(root, pub, lay, tables[key])
        return lambda root, pub: BUILDERS[key](root, pub, lay)

    return [one(key) for key in lay.exhibits] + [lambda root, pub, run=run: cascades(root, pub, lay, run)
                                                 for run in lay.cascades]


# ---------------------------------------------------------------- layouts
HUANG_EXHIBITS = ("huang/table1", "huang/fig2", "huang/fig3", "huang/table4", "huang/table6")

CPU = Layout(
    name="cpu", scale="CPU scale",
    exhibits=(*HUANG_EXHIBITS, "metasd/main", "metasd/heads", "metasd/bandits", "metasd/variance", "metasd/convergence",
              "metasd/full_info", "metasd/switching", "metasd/stream"),
    huang_pair={"eagle_translation": ("translation", "T5-small"), "eagle_summarization": ("summarization", "T5-small-XSum")},
    huang_models="SmolLM2-135M with its translation and summarization draft heads",
    held_out="16 (per source)", table1_reward=MEASURED_REWARD, table4_reward=MEASURED_REWARD,
    alpha_arms=("early_exit_8", "early_exit_24"),
    alpha_note="early exits after 8 (cheap, poorly aligned) and 24 (dearer, better aligned) of SmolLM2's 30 layers, on XSum",
    depth_note=("Early exits of SmolLM2 after 8, 16 and 24 of 30 layers (untrained exits, which accept few tokens; the "
                "paper-scale run uses LayerSkip's trained exits)"),
    training_note="the paper trains on 1k-10k queries, this CPU run on at most the collected ones.",
    metasd=(MetaRun("metasd/eval", "metasd/main",
                    "MetaSD, main table: single drafters, baselines and bandits on a mixed stream", SPECIALISTS, GENERALIST,
                    ucb_row="MetaSpS-UCB", setting="one mixed, interleaved stream of the local real data (published values: other tasks and "
                            "drafters, so set beside, not compared)"),),
    stream_note=("The task changes inside one conversation: the stream's queries (local data, in task blocks) are the "
                 "turns of one chat, each prompted after the earlier turns and the model's own answers "
                 "(conversation_length)."),
    cascades=(CascadeRun("greedy", "greedy", "agreement",
                         "agreement with the target's output (mean share of token positions equal to the autoregressive "
                         "output)", greedy=True),
              CascadeRun("sampling", "temperature 1", "rouge2_summarization",
                         "ROUGE-2 on summarization (at temperature 1 two samples disagree whatever the rule, and the 135M "
                         "target scores near zero on BLEU and GSM8K, so those cannot separate rules)")),
)

PAPER = Layout(
    name="paper", scale="paper scale",
    exhibits=("spec_bench/leaderboard", *HUANG_EXHIBITS, "metasd/main", "metasd/whitebox", "metasd/heads",
              "metasd/convergence", "metasd/switching", "metasd/stream", "metasd/multilingual"),
    huang_pair={"t5_small": ("translation", "T5-small"), "t5_small_xsum": ("summarization", "T5-small-XSum")},
    huang_models="T5-large with t5-small and Muennighoff/t5-small-finetuned-xsum-512 (translation English->German)",
    held_out="the test-split",
    alpha_arms=("early_exit_4", "early_exit_12"),
    alpha_note="LayerSkip Llama-3.2-1B's trained exits after 4 (cheap) and 12 (dearer, better aligned) of 16 layers, on XSum",
    depth_note="LayerSkip Llama-3.2-1B's trained exits after 4, 8 and 12 of 16 layers, on XSum",
    training_note="the policy trains on the collected train-split queries, up to all of them.",
    metasd=(MetaRun("metasd/eval", "metasd/main",
                    "MetaSD, black-box: task-specialised 68M drafters, baselines and bandits on Spec-Bench",
                    {"code": "coding", "qa": "qa", "summarization": "summarization", "math": "math_reasoning",
                     "translation": "translation"}, None, "MetaSpS-UCB",
                    "Vicuna-7B v1.3 on Spec-Bench's question.jsonl, every turn"),
            MetaRun("metasd/eagle", "metasd/whitebox",
                    "MetaSD, white-box: EAGLE-1 heads (the published one and one per task), baselines and bandits",
                    {"eagle_code": "coding", "eagle_qa": "qa", "eagle_summarization": "summarization",
                     "eagle_math": "math_reasoning", "eagle_translation": "translation"}, "eagle", "MetaEagle-UCB",
                    "Vicuna-7B v1.3 on Spec-Bench's question.jsonl, every turn")),
    tasks=None, task_columns={"coding": "code"}, languages=("ja", "ru", "de", "fr", "zh"),
    stream_note=("Spec-Bench's questions in file order (category blocks); the task changes between the questions of "
                 "the stream, not inside one conversation."),
    cascades=tuple(CascadeRun(name, title, "quality", f"{metric} (the task's metric)") for name, title, metric in (
        ("t5_wmt", "T5, WMT en->de", "corpus BLEU"), ("t5_xsum", "T5, XSum", "ROUGE-2 F x 100"),
        ("t5_cnndm", "T5, CNN/DM", "ROUGE-2 F x 100"), ("gemma_gsm8k", "Gemma-2 9B, GSM8K", "accuracy"),
        ("gemma27b_gsm8k", "Gemma-2 27B, GSM8K", "accuracy"))),
)
LAYOUTS = {lay.name: lay for lay in (CPU, PAPER)}
