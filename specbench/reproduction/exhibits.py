"""The reproduced tables and figures: each a function of run directories under one root.

Every builder reads the files our commands write (``summary.csv`` of eval, ``summary.csv`` /
``alpha_sweep.csv`` / ``data_efficiency.csv`` of train-policy, ``convergence.csv``, ``curves.csv`` of
cascades), lays them out as the paper does (rows and columns named as in the paper, where it has
them), sets the published numbers beside ours and checks the paper's claim (``verdicts``). A
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

TASKS = ("translation", "summarization", "math", "chat")
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
def huang_table1(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    summary = _csv(root, "huang/eval/summary.csv")
    sp = speeds(summary)
    rows = [(f"fixed:{d}", d, paper_row) for d, (_, paper_row) in lay.huang_pair.items()] + [("policy", "policy", "policy")]
    table = pd.DataFrame([{"drafter": label, **{t: sp.get(t, {}).get(m, math.nan) for t in ("translation", "summarization")}}
                          for m, label, _ in rows])
    table = with_published(table, published, "huang", "table1", {label: p for _, label, p in rows},
                           ["translation", "summarization"])
    pair = {d: task for d, (task, _) in lay.huang_pair.items()}
    own = {t: {d: v for d, v in drafter_speeds(summary).get(t, {}).items() if d in pair} for t in pair.values()}
    best = {t: max(v.values()) for t, v in own.items() if v}
    policy = {t: sp.get(t, {}).get("policy", math.nan) for t in best}
    notes = ("Speedup over autoregressive decoding on held-out rows (the policy's eval slice, disjoint from the "
             "collected queries). Paper: T5-large target with T5-small (a generalist that translates well) and "
             f"T5-small-XSum; ours: {lay.huang_models}.")
    val = replayed(_optional(root, "huang/policy/summary.csv"))
    if val:
        notes += " Replayed on the validation queries of the collection: " + ", ".join(
            f"{k} {v:.3f}" for k, v in val.items() if not math.isnan(v)) + "."
    return Exhibit("huang/table1", "Huang et al., Table 1: each specialist on both tasks, and the policy", table, [
        V.each_fastest_on_own_task(own, pair, "each specialist speeds up its own task more than the other specialist does"),
        V.within_of_best_everywhere(policy, best, 0.95, "the policy is within 5% of the best drafter on every task"),
    ], notes, ["huang/eval", "huang/policy"])


def huang_fig2(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    df = _csv(root, "huang/depth/alpha/alpha_sweep.csv")
    shares = [c for c in df.columns if c.startswith("share_")]
    arms = [c.removeprefix("share_") for c in shares]
    cheap, aligned = lay.alpha_arms
    lo, hi = df.loc[df.alpha.idxmin()], df.loc[df.alpha.idxmax()]
    verdict = V.choice_moves({a: lo[f"share_{a}"] for a in arms}, {a: hi[f"share_{a}"] for a in arms}, cheap, aligned,
                             "the alpha sweep moves the choice from the cheap drafter (alpha 0) to the better-aligned one (alpha 1)")

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
    verdict = V.above(last.speedup_replayed, first.speedup_replayed,
                      "more training queries give at least the speed of the fewest",
                      (f"{int(last.n_examples)} queries", f"{int(first.n_examples)}"), tolerance=1e-9)

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


def huang_table4(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    sp = replayed(_csv(root, "huang/math/policy/summary.csv"))
    alone = {k.removeprefix("always "): v for k, v in sp.items() if k.startswith("always ") and k != "always autoregressive"}
    best_alone = max(alone.values()) if alone else math.nan
    table = pd.DataFrame([{"method": f"{a} alone", "speedup": v} for a, v in alone.items()] +
                         [{"method": "drafting alone (best drafter)", "speedup": best_alone},
                          {"method": "policy with the autoregressive arm", "speedup": sp.get("policy", math.nan)}])
    table = with_published(table, published, "huang", "table4",
                           {"drafting alone (best drafter)": "drafting alone",
                            "policy with the autoregressive arm": "policy with the autoregressive arm"}, ["speedup"])
    policy = sp.get("policy", math.nan)
    return Exhibit("huang/table4", "Huang et al., Table 4: math, with the autoregressive arm", table, [
        V.above(policy, best_alone, "with the autoregressive arm the policy is at least as fast as drafting alone",
                ("policy", "best drafter alone"), tolerance=1e-9),
        V.at_least_fraction(policy, 1.0, 0.95, "the policy holds at least 0.95x of autoregressive speed",
                            ("policy", "autoregressive")),
    ], "GSM8K rows; speedups replayed from the measured speculative runs on the policy's validation queries.",
        ["huang/math/collect", "huang/math/policy"])


def huang_table6(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    without = replayed(_csv(root, "huang/depth/without_ar/summary.csv"))
    with_ar = replayed(_csv(root, "huang/depth/with_ar/summary.csv"))
    alone = {k: v for k, v in with_ar.items() if k.startswith("always ")}
    table = pd.DataFrame([{"method": k, "speedup": v} for k, v in alone.items()] +
                         [{"method": "policy without the autoregressive arm", "speedup": without.get("policy", math.nan)},
                          {"method": "policy with the autoregressive arm", "speedup": with_ar.get("policy", math.nan)}])
    return Exhibit("huang/table6", "Huang et al., Table 6: drafters at several depths, with and without the autoregressive arm",
                   table, [V.above(with_ar.get("policy", math.nan), without.get("policy", math.nan),
                                   "adding the autoregressive arm does not slow the policy down",
                                   ("with", "without"), tolerance=1e-9)],
                   f"{lay.depth_note}; speedups replayed on the validation queries.",
                   ["huang/depth/collect", "huang/depth/without_ar", "huang/depth/with_ar"])


# ---------------------------------------------------------------- MetaSD
METASD_ROWS = {"random-query": "random drafter per query", "random": "uniform mixture per round", "exp3-bd": "EXP3",
               "halving-bd": "sequential halving", "ucb-be": "UCB-BE", "ucb-bd": "UCB-BD",
               "ucb-switch-bd": "UCB-BD with a switching cost", ORACLE: "oracle (best single drafter per task)"}


def _tasks(sp: dict, lay: Layout) -> list[str]:
    order = lay.tasks if lay.tasks is not None else [t for t in sp if t != ALL_TASKS]
    return [t for t in order if t in sp]


def metasd_table(root: Path, published: list[Published], lay: Layout, meta: MetaRun) -> Exhibit:
    summary = _csv(root, f"{meta.run}/summary.csv")
    sp = speeds(summary)
    tasks = _tasks(sp, lay) + [ALL_TASKS]
    methods = [m for m in dict.fromkeys(summary.method) if m != "autoregressive"]
    label = lambda m: m.split(":", 1)[1] if m.startswith("fixed:") else METASD_ROWS.get(m, m)  # noqa: E731
    table = pd.DataFrame([{"method": label(m), **{t: sp[t].get(m, math.nan) for t in tasks}} for m in methods])
    pub = [p for p in published if p.paper == "metasd" and p.exhibit == "main" and p.row == meta.ucb_row]
    if pub:  # paper scale: the paper's UCB row beside ours, on the columns it publishes
        cols = [t for t in tasks if any(p.column == lay.task_columns.get(t, t) for p in pub)]
        table = with_published(table, published, "metasd", "main", {"UCB-BD": meta.ucb_row}, cols, lay.task_columns)
    ds = drafter_speeds(summary)
    own = {d: t for d, t in meta.specialists.items() if any(d in ds.get(task, {}) for task in sp)}
    best_single = max(ds.get(ALL_TASKS, {}).values(), default=math.nan)
    ucb = sp.get(ALL_TASKS, {}).get("ucb-bd", math.nan)
    oracle = sp.get(ALL_TASKS, {}).get(ORACLE, math.nan)
    shown = [p for p in published if p.paper == "metasd" and p.exhibit == "main"]
    notes = (f"Speedup over autoregressive decoding, {meta.setting} (oracle: the best single drafter per task, measured "
             "in the same run). Published (Vicuna-7B on an A100): " +
             "; ".join(f"{p.row} on {p.column} {p.value:.3f} ({p.setting.split(':')[0]})" for p in shown) + ".")
    verdicts = [
        V.at_least_fraction(ucb, oracle, 0.95, "UCB-BD reaches at least 0.95 of the per-task oracle on the mixed stream",
                            ("UCB-BD", "oracle")),
        V.above(ucb, best_single, "UCB-BD is above the best single drafter on the mixed stream",
                ("UCB-BD", "best single drafter")),
        V.each_fastest_on_own_task(ds, own),
    ]
    if meta.generalist:
        verdicts.append(V.specialist_margin(ds, own, meta.generalist))
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
    return Exhibit("metasd/heads", "Specialist drafters: acceptance rate / MAT of every specialist on every task", table,
                   [V.each_fastest_on_own_task({t: {h: mat[t].get(h, math.nan) for h in heads} for t in mat}, own,
                                               "each specialist has the highest MAT among the specialists on its own task")],
                   "From the MetaSD run's single-drafter rows (greedy).", [meta.run])


def metasd_convergence(root: Path, published: list[Published], lay: Layout, first_rounds: int = 20) -> Exhibit:
    conv = _csv(root, "metasd/eval/convergence.csv")
    early = conv[conv["round"] < first_rounds].groupby("method").share.mean()
    bd, be = early.get("ucb-bd", math.nan), early.get("ucb-be", math.nan)
    table = early.rename("share of the first rounds on the oracle's arm").reset_index()

    def plot(path: Path) -> None:
        def draw(ax):
            for m in ("ucb-bd", "ucb-be"):
                sub = conv[(conv.method == m) & (conv["round"] < 40)]
                ax.plot(sub["round"], sub.share, label=METASD_ROWS.get(m, m))
        _figure(path, draw, f"MetaSD convergence ({lay.scale}): BD vs BE", "round within a query",
                "share playing the oracle's arm", ylim=(0, 1.02))

    return Exhibit("metasd/convergence", "MetaSD, convergence: Block Divergence against Block Efficiency", table,
                   [V.above(bd, be, f"BD reaches the best arm sooner than BE (share on it over the first {first_rounds} rounds)",
                            ("UCB-BD", "UCB-BE"))],
                   "Share of rounds, by round index within a query, in which the selector played its task's oracle arm.",
                   ["metasd/eval"], plot)


def metasd_switching(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    summary = _csv(root, "metasd/eval/summary.csv")
    rows = summary[(summary.task == ALL_TASKS) & summary.method.isin(["ucb-bd", "ucb-switch-bd"])]
    table = rows[["method", "speedup", "switches", "mat"]].reset_index(drop=True)
    get = lambda m, c: float(rows[rows.method == m][c].iloc[0]) if (rows.method == m).any() else math.nan  # noqa: E731
    fewer = V.above(get("ucb-bd", "switches"), get("ucb-switch-bd", "switches"),
                    "the switching cost cuts drafter switches", ("UCB-BD switches", "with the cost"))
    speed = V.above(get("ucb-switch-bd", "speedup"), get("ucb-bd", "speedup"),
                    "the switching-cost variant keeps UCB-BD's speed (within 3%)", ("with the cost", "UCB-BD"), tolerance=0.03)
    return Exhibit("metasd/switching", "MetaSD, switching-cost variant", table, [fewer, speed],
                   "Whole mixed stream. switches: drafter changes between consecutive rounds, summed over queries.",
                   ["metasd/eval"])


def metasd_stream(root: Path, published: list[Published], lay: Layout) -> Exhibit:
    summary = _csv(root, "metasd/stream/summary.csv")
    sp = speeds(summary)
    tasks = _tasks(sp, lay) + [ALL_TASKS]
    methods = [m for m in ("ucb-bd", "ducb-bd", "swucb-bd") if m in sp.get(ALL_TASKS, {})]
    names = {"ucb-bd": "UCB", "ducb-bd": "D-UCB", "swucb-bd": "SW-UCB"}
    table = pd.DataFrame([{"method": names[m], **{t: sp[t].get(m, math.nan) for t in tasks}} for m in methods])
    alls = sp.get(ALL_TASKS, {})
    adaptive = max(alls.get("ducb-bd", math.nan), alls.get("swucb-bd", math.nan))
    return Exhibit("metasd/stream", "MetaSD, non-stationary stream: discounted and sliding-window UCB against UCB", table,
                   [V.above(adaptive, alls.get("ucb-bd", math.nan),
                            "D-UCB or SW-UCB is above UCB when the task changes under the selector", ("best of D-UCB/SW-UCB", "UCB"))],
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
                   [V.within_of_best_everywhere(ucb, oracle, 0.95, "UCB-BD is within 5% of the oracle for every source language")],
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
    alls = ds.get(ALL_TASKS, {})
    others = max((v for d, v in alls.items() if d != "eagle"), default=math.nan)
    return Exhibit("spec_bench/leaderboard", "Spec-Bench reference rows: each drafter alone on question.jsonl", table,
                   [V.above(alls.get("eagle", math.nan), others, "EAGLE is the fastest of the reference drafters, as on "
                            "the leaderboard", ("EAGLE", "the next fastest"))],
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
    # Under greedy decoding lossy SD is plain SD for alpha < 1 and the drafter alone at alpha = 1: its
    # two points are those rows.
    greedy_lossy = {"sd": 0.0, "drafter_alone": 1.0} if run.greedy else {}
    # The verdict's points: every rule at every alpha (lossy SD among them); plain SD and the drafter
    # alone are not rule points, except as greedy lossy SD's.
    plain = {"autoregressive", "sd", "drafter_alone"}
    points = [{"rule": "lossy_sd" if r.method in greedy_lossy else r.rule, "speedup": r.speedup,
               "quality": getattr(r, quality), "alpha": greedy_lossy.get(r.method, r.alpha)}
              for r in pts.itertuples() if r.method in greedy_lossy or r.method not in plain]

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
    return Exhibit(f"cascades/{run.name}", f"Speculative cascades, quality against speedup ({run.title})", pts,
                   [V.faster_at_equal_quality(points)], notes, [f"cascades/{run.name}"], plot)


BUILDERS: dict[str, Callable[[Path, list[Published], Layout], Exhibit]] = {
    "huang/table1": huang_table1, "huang/fig2": huang_fig2, "huang/fig3": huang_fig3, "huang/table4": huang_table4,
    "huang/table6": huang_table6,
    "metasd/heads": metasd_heads,
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
    exhibits=(*HUANG_EXHIBITS, "metasd/main", "metasd/heads", "metasd/convergence", "metasd/switching", "metasd/stream"),
    huang_pair={"eagle_translation": ("translation", "T5-small"), "eagle_summarization": ("summarization", "T5-small-XSum")},
    huang_models="SmolLM2-135M with its translation and summarization draft heads",
    alpha_arms=("early_exit_8", "early_exit_24"),
    alpha_note="early exits after 8 (cheap, poorly aligned) and 24 (dearer, better aligned) of SmolLM2's 30 layers, on XSum",
    depth_note=("Early exits of SmolLM2 after 8, 16 and 24 of 30 layers (untrained exits, which accept few tokens; the "
                "paper-scale run uses LayerSkip's trained exits)"),
    training_note="the paper trains on 1k-10k queries, this CPU run on at most the collected ones.",
    metasd=(MetaRun("metasd/eval", "metasd/main",
                    "MetaSD, main table: single drafters, baselines and bandits on a mixed stream", SPECIALISTS, GENERALIST,
                    setting="one mixed, interleaved stream of the local real data (published values: other tasks and "
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
