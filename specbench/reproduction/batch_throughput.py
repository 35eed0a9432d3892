"""Throughput against batch size (issue 57): the page of several ``specbench eval`` runs of one experiment, each at
its own ``decoding.batch_size`` (``make batch-throughput``: ``experiment=batch_cpu`` at 1, 4, 16 and 32).

Read from the run directories (``config.yaml``, ``examples.jsonl``), nothing re-timed. Per batch size and method: the
queries, new tokens and seconds (a batched run's records apportion each batch's wall time, so the totals are the
batches' own), new tokens per second, the ratio to plain (batched) autoregressive decoding at the same batch size
(methods interleaved batch by batch in one process), the ratio to autoregressive decoding at batch size 1 (another
process: the throughput a batch buys), and the share of queries whose output equals batch 1's autoregressive output
(bf16 rounds a batched forward differently, so a greedy output may fork at a near-tie: the run's ``forks.csv``
certifies each against its own autoregressive method), and the ratio to Hugging Face ``generate`` on the same batches
(``hf:generate``) where the run has it. Then, for the batch budget's methods (``goodput:<drafter>``), from the runs'
``rounds.jsonl``: the draft tokens a row verified a round against what its drafter offered, the share of rounds it
verified none, and its calibration: accepted tokens over the tokens it expected, and measured over predicted seconds
of the forwards. Last, per batch of each batched run (``batches.jsonl``, in the order the methods ran): where its wall
time went, the target forwards' seconds (its rounds' ``t_verify``), drafting's, and the rest (the prefill and each
round's bookkeeping), beside its forwards and the draft tokens it verified: two methods that did the same work (the
same forwards, no draft token verified) show how much the same work's time moves from one slot of the process to
the next.

With ``--before RUN`` (a batch-1 run of the same queries by the code before batching, ``make batch-before``), the page
also sets this code's batch-1 speed beside it, per method both runs ran: the paired speed ratio over queries (this
code / before) with its 95% interval; "within noise" when the interval holds 1 (issue 57: batch 1 must not slow).
With ``--repeats RUN...`` (more runs of some batch sizes, each its own process: ``make batch-repeats``), each
method's ratio to autoregressive decoding in every run of that batch size, with its mean and 95% t-interval over the
runs: one run's ratio at a large batch moves with the process's own noise.

    python -m specbench.reproduction.batch_throughput outputs/batch_cpu/b1 outputs/batch_cpu/b4 ... --out PAGE.md \
        [--before outputs/batch_cpu/before] [--repeats outputs/batch_cpu/b32_2 ...]
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from specbench import provenance
from specbench.arms import AUTOREGRESSIVE, GOODPUT, HF_GENERATE
from specbench.errors import SpecbenchError, exit_on
from specbench.files import atomic_write_text, existing
from specbench.pipelines.tables import to_markdown
from specbench.records import BATCHES, CONFIG, EXAMPLES, ROUNDS, read_jsonl
from specbench.reproduction import intervals as CI


def examples(run: Path) -> tuple[int, pd.DataFrame]:
    """A run's batch size and its examples (the last record of each query and method)."""
    run = Path(run)
    if not (run / EXAMPLES).is_file():
        raise SpecbenchError(
            f"{run} holds no {EXAMPLES}", "pass the directories `make batch-throughput` wrote"
        )
    return batch_size(run), pd.DataFrame(list(read_jsonl(run / EXAMPLES))).drop_duplicates(
        ["query_id", "method"], keep="last"
    )


def batch_size(run: Path) -> int:
    """The ``decoding.batch_size`` a run directory's ``config.yaml`` ran at (1 when unset)."""
    return int(OmegaConf.select(OmegaConf.load(Path(run) / CONFIG), "decoding.batch_size", default=1) or 1)


def run_table(run: Path) -> pd.DataFrame:
    """One run's rows: batch size, method, queries, new tokens, seconds, tokens/s, its examples' outputs."""
    size, ex = examples(run)
    rows = []
    for method, g in ex.groupby("method", sort=False):
        rows.append(
            {
                "batch size": size,
                "method": method,
                "queries": len(g),
                "new tokens": int(g.new_tokens.sum()),
                "seconds": float(g.seconds.sum()),
                "outputs": dict(zip(g.query_id, map(tuple, g.output_ids))),
            }
        )
    return pd.DataFrame(rows)


def table(runs: list[Path]) -> pd.DataFrame:
    """Every run's rows, with tokens/s and the ratios of the module's docstring."""
    t = pd.concat([run_table(r) for r in runs], ignore_index=True)
    t["tokens/s"] = t["new tokens"] / t["seconds"]
    ar = t[t.method == AUTOREGRESSIVE].set_index("batch size")["tokens/s"]
    t["vs autoregressive, same batch"] = [
        r["tokens/s"] / ar.get(r["batch size"], float("nan")) for _, r in t.iterrows()
    ]
    hf = t[t.method == HF_GENERATE].set_index("batch size")["tokens/s"]
    if len(hf):
        t["vs hf:generate, same batch"] = [
            r["tokens/s"] / hf.get(r["batch size"], float("nan")) for _, r in t.iterrows()
        ]
    base = t[(t.method == AUTOREGRESSIVE) & (t["batch size"] == 1)]
    t["vs autoregressive at batch 1"] = (
        t["tokens/s"] / float(base["tokens/s"].iloc[0]) if len(base) else float("nan")
    )
    reference = base.outputs.iloc[0] if len(base) else {}
    t["same output as batch 1"] = [
        sum(reference.get(q) == o for q, o in r.outputs.items()) / max(len(r.outputs), 1)
        if reference
        else float("nan")
        for _, r in t.iterrows()
    ]
    return t.drop(columns="outputs").sort_values(["batch size", "method"]).reset_index(drop=True)


def repeat_table(runs: list[Path], repeats: list[Path]) -> pd.DataFrame:
    """Per batch size that ``repeats`` ran again (each a process of its own over the same queries) and method: its
    ratio to autoregressive decoding in each run of that batch size (within a run the methods were interleaved, so
    each ratio is paired), their mean, range and 95% t-interval over the runs: what a run's own noise (one process's
    memory and neighbours) does to a ratio that a single run gives as one number."""
    by_size: dict[int, list[pd.DataFrame]] = {}
    for run in [*runs, *repeats]:
        t = run_table(run)
        ar = t[t.method == AUTOREGRESSIVE]
        if ar.empty or int(t["batch size"].iloc[0]) == 1:
            continue
        base = float(ar["new tokens"].iloc[0] / ar.seconds.iloc[0])
        t["ratio"] = t["new tokens"] / t.seconds / base
        by_size.setdefault(int(t["batch size"].iloc[0]), []).append(t)
    rows = []
    for size, tables in sorted(by_size.items()):
        if len(tables) < 2:
            continue
        both = pd.concat(tables)
        for method, g in both[both.method != AUTOREGRESSIVE].groupby("method", sort=True):
            r = g.ratio.to_numpy(float)
            if len(r) < 2:  # a method only one run ran: the table above has it
                continue
            half = CI.t_quantile(0.975, len(r) - 1) * float(r.std(ddof=1)) / len(r) ** 0.5
            rows.append(
                {
                    "batch size": size,
                    "method": method,
                    "runs": len(r),
                    "each run's ratio": ", ".join(f"{x:.3f}" for x in r),
                    "mean": float(r.mean()),
                    "95% CI low": float(r.mean()) - half,
                    "95% CI high": float(r.mean()) + half,
                }
            )
    return pd.DataFrame(rows)


AA = "again:autoregressive"  # the A/A arm: autoregressive decoding run twice in one run
AA_RESOLVES = 0.05  # the half-width the A/A interval must stay within to tell a 5% difference apart


def aa_lines(r: pd.DataFrame) -> list[str]:
    """The A/A arm's reading at each batch size run more than once: its interval over runs, whether it holds 1 and
    whether its half-width is within ``AA_RESOLVES`` (the page resolves a 5% difference there)."""
    out = []
    for _, row in r[r.method == AA].iterrows():
        half = (row["95% CI high"] - row["95% CI low"]) / 2
        holds = row["95% CI low"] <= 1 <= row["95% CI high"]
        out.append(
            f"- batch {int(row['batch size'])}: the A/A ratio is {row['mean']:.3f} over {int(row['runs'])} runs, 95% "
            f"interval [{row['95% CI low']:.3f}, {row['95% CI high']:.3f}] (half-width {half:.3f}): "
            + (
                "it holds 1"
                if holds
                else "**it does not hold 1**: the two identical arms differ beyond the noise"
            )
            + (
                f", and resolves {AA_RESOLVES:.0%}"
                if half <= AA_RESOLVES
                else f", and is wider than {AA_RESOLVES:.0%}: a ratio within it is not told apart"
            )
            + "."
        )
    if not out:
        return []
    return [
        "",
        f"A/A (`{AA}`: autoregressive decoding a second time in the same runs, its own slot in the rotation), the "
        "noise every ratio above is read against:",
        "",
        *out,
    ]


def repeat_lines(runs: list[Path], repeats: list[Path]) -> list[str]:
    r = repeat_table(runs, repeats)
    if r.empty:
        return []
    return [
        "",
        "## Runs again",
        "",
        "Per batch size run more than once (each run a process of its own over the same queries; "
        + ", ".join(str(x) for x in repeats)
        + " beside the runs above) and method: its tokens per second over autoregressive decoding's in each run "
        "(paired: the methods of a run are interleaved), their mean and the 95% t-interval over the runs. A ratio "
        "whose interval holds 1 is not told apart from autoregressive decoding at that batch size.",
        "",
        to_markdown(r, floatfmt=".3f"),
        "",
    ]


def before_table(runs: list[Path], before: Path) -> pd.DataFrame:
    """Per method of the batch-1 run among ``runs`` that ``before`` ran too: the paired speed ratio over their common
    queries (this code's tokens per second over before's, each query's seconds and tokens paired) with its interval,
    and whether the interval holds 1."""
    now = [(run, ex) for run in runs for size, ex in [examples(run)] if size == 1]
    size, old = examples(before)
    if not now or size != 1:
        raise SpecbenchError(
            "--before compares batch-1 runs: "
            + ("no run given is at batch size 1" if not now else f"{before} ran at batch size {size}"),
            "pass this code's batch-1 run among the runs and a batch-1 run of the code before batching as --before",
        )
    _check_other_code(now[0][0], before)
    rows = []
    for method, mine in now[0][1].groupby("method", sort=False):
        theirs = old[old.method == method].set_index("query_id")
        ids = sorted(set(mine.query_id) & set(theirs.index))
        if not ids:
            continue
        mine = mine.set_index("query_id").loc[ids]
        cols = {
            "a_s": mine.seconds.to_numpy(float),
            "a_t": mine.new_tokens.to_numpy(float),
            "b_s": theirs.loc[ids].seconds.to_numpy(float),
            "b_t": theirs.loc[ids].new_tokens.to_numpy(float),
        }
        point, lo, hi, _ = CI.estimate(cols, CI.speed_ratio(), 1.0, CI.DEFAULT)
        rows.append(
            {
                "method": method,
                "queries": len(ids),
                "speed, this code / before": point,
                "95% CI low": lo,
                "95% CI high": hi,
                "within noise": "yes" if lo <= 1 <= hi else "no",
            }
        )
    return pd.DataFrame(rows)


def _check_other_code(now: Path, before: Path) -> None:
    """Refuse a ``before`` run recorded at the same commit as this code's batch-1 run ``now``: it ran this code, not
    the code before batching (``python -m`` puts the working directory ahead of ``PYTHONPATH``, so a worktree named
    there is not what runs unless the working directory is taken off ``sys.path``)."""
    same = set(provenance.commits_under(now)) & set(provenance.commits_under(before)) - {"unrecorded"}
    if same:
        raise SpecbenchError(
            f"--before {before} came from the same code as {now} ({', '.join(sorted(same))}): it did not run the "
            "code before batching",
            "run the earlier commit from its own checkout, with the working directory off sys.path (make "
            "batch-one-check does: PYTHONPATH at the worktree and sys.path[0] removed)",
        )


def _rounds_of(runs: list[Path]):
    """Each run with rounds: ``(run, its batch size, its rounds.jsonl as a frame)``."""
    for run in map(Path, runs):
        if not (run / ROUNDS).is_file():
            continue
        r = pd.DataFrame(list(read_jsonl(run / ROUNDS)))
        if not r.empty and "method" in r:
            yield run, batch_size(run), r


def budget_table(runs: list[Path]) -> pd.DataFrame:
    """Per run and batch-budget method: rounds, draft tokens verified and offered a row-round, the share of
    row-rounds that verified none, accepted over expected tokens, and measured over predicted forward seconds."""
    rows = []
    for _, size, r in _rounds_of(runs):
        for method, g in r[r.method.str.startswith(GOODPUT)].groupby("method", sort=True):
            rows.append(
                {
                    "batch size": size,
                    "method": method,
                    "row-rounds": len(g),
                    "verified a round": float(g.drafted.mean()),
                    "asked a round": float(g.n_max.mean()),
                    "rounds verifying none": float((g.drafted == 0).mean()),
                    "accepted / expected": float(g.accepted.sum() / g.expected.sum())
                    if g.expected.sum()
                    else float("nan"),
                    "measured / predicted seconds": float(g.t_verify.sum() / g.predicted_s.sum()),
                }
            )
    return pd.DataFrame(rows)


def work_table(runs: list[Path]) -> pd.DataFrame:
    """Per run's batch size and method: the target forwards, the rows in a forward, the tokens a forward fed (every
    row's last token and its draft or tree), the new tokens a forward gave, and the milliseconds a forward took (its
    rows' shares of it, with their verdicts). At batch 1 each round is its own forward."""
    rows = []
    for run, size, r in _rounds_of(runs):
        if "forward" not in r or r["forward"].isna().all():
            r["forward"] = range(len(r))
        tree = pd.Series(r.get("tree_size", 0), index=r.index).fillna(0)
        r["fed"] = 1 + r.drafted.where(tree == 0, tree)
        if "emitted" not in r:  # records before the emitted count: the accepted tokens and the bonus token
            r["emitted"] = r["accepted"] + 1 if "accepted" in r else 1
        for method, g in r.groupby("method", sort=True):
            # a forward is one of a wave: the same forward index within one wave's queries
            per = g.groupby(["forward", g.query_id.map(_wave_of(run, method))])
            rows.append(
                {
                    "batch size": size,
                    "method": method,
                    "forwards": per.ngroups,
                    "rows a forward": float(per.size().mean()),
                    "tokens fed a forward": float(per.fed.sum().mean()),
                    "new tokens a forward": float(per.emitted.sum().mean()),
                    "ms a forward": 1000 * float(per.t_verify.sum().mean()),
                }
            )
    return pd.DataFrame(rows)


def _wave_of(run: Path, method: str) -> dict:
    """``{query id: its wave}`` for ``method`` in a batched run (``batches.jsonl``); every query its own at batch 1."""
    if not (Path(run) / BATCHES).is_file():
        return _Own()
    return {
        q: b["batch"]
        for b in read_jsonl(Path(run) / BATCHES)
        if b["method"] == method
        for q in b["query_ids"]
    }


class _Own(dict):
    def __missing__(self, key):
        return key


def _batched_rounds(runs: list[Path]):
    """Each batched run's batches in the order they ran: ``(run, batch size, the batch's record, its rows' rounds)``."""
    for run in map(Path, runs):
        if not (run / BATCHES).is_file() or not (run / ROUNDS).is_file():
            continue
        size = batch_size(run)
        r = pd.DataFrame(list(read_jsonl(run / ROUNDS)))
        if r.empty:
            continue
        for b in read_jsonl(run / BATCHES):
            yield run, size, b, r[(r.method == b["method"]) & r.query_id.isin(b["query_ids"])]


def batch_times(runs: list[Path]) -> pd.DataFrame:
    """Per batched run, batch and method, in the order they ran: the slot it ran in, wall seconds, forward seconds,
    drafting seconds, the rest, target forwards, draft tokens verified and new tokens."""
    rows = []
    slots: dict[tuple, int] = {}
    for run, size, b, mine in _batched_rounds(runs):
        forward = float(mine.t_verify.sum())
        drafting = float((mine.t_draft + mine.t_select + mine.t_switch).sum())
        slot = slots[run, b["batch"]] = slots.get((run, b["batch"]), 0) + 1
        rows.append(
            {
                "batch size": size,
                "batch": b["batch"],
                "slot": slot,
                "method": b["method"],
                "seconds": float(b["seconds"]),
                "forward seconds": forward,
                "drafting seconds": drafting,
                "the rest": float(b["seconds"]) - forward - drafting,
                "forwards": int(b["forwards"]),
                "draft tokens verified": int(mine.drafted.sum()),
                "new tokens": int(b["new_tokens"]),
            }
        )
    return pd.DataFrame(rows)


def forward_times(runs: list[Path]) -> pd.DataFrame:
    """Per batch size and method, the target forwards grouped by whether they held every row the batch may hold
    (``full``) or fewer (rows that finished had left and no query was waiting), and by whether any row verified a
    draft token: the forwards and their mean milliseconds. Each forward is read back from the rounds: the rounds
    that record forward ``i`` of a wave (``Round.forward``; in runs before it, a static batch's round ``i`` of every
    row still in it), its seconds the sum of their shares (``t_verify``)."""
    forwards = []
    for _, size, b, mine in _batched_rounds(runs):
        key = "forward" if "forward" in mine and mine["forward"].notna().all() else "round"
        if key not in mine:
            continue
        for _, f in mine.groupby(key):
            full = "full" if len(f) == min(int(b.get("rows", size)), len(b["query_ids"])) else "fewer"
            forwards.append((size, b["method"], full, bool((f.drafted > 0).any()), float(f.t_verify.sum())))
    f = pd.DataFrame(forwards, columns=["batch size", "method", "rows", "drafted", "seconds"])
    rows = [
        {
            "batch size": size,
            "method": method,
            "rows in the forward": full,
            "a row drafted": "yes" if drafted else "no",
            "forwards": len(g),
            "ms a forward": 1000 * float(g.seconds.mean()),
        }
        for (size, method, full, drafted), g in f.groupby(
            ["batch size", "method", "rows", "drafted"], sort=True
        )
    ]
    return pd.DataFrame(rows)


def plot(t: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for method, g in t.groupby("method"):
        ax.plot(g["batch size"], g["tokens/s"], marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (queries a forward)")
    ax.set_ylabel("new tokens per second")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(
    runs: list[Path],
    out: Path,
    before: Path | None = None,
    repeats: list[Path] | None = None,
    forwards: Path | None = None,
) -> Path:
    """The page of ``runs`` (one a batch size), with ``before`` (batch 1 of the code before batching) and ``repeats``
    (more runs of some batch sizes: the ratios' spread over runs) when given. Runs that did not decode the same
    queries with the same target, data and limits are refused: their ratios across runs would compare other work."""
    check_comparable([*runs, *(repeats or []), *([before] if before is not None else [])])
    t = table(runs)
    compared = before_lines(runs, before) if before is not None else []
    out = Path(out)
    figure = out.with_suffix(".png")
    try:
        plot(t, figure)
        picture = [f"![tokens per second against batch size]({figure.name})", ""]
    except ImportError:
        picture = []
    lines = [
        "# Throughput against batch size",
        "",
        "Generated by `python -m specbench.reproduction.batch_throughput "
        + " ".join(str(r) for r in runs)
        + (f" --before {before}" if before is not None else "")
        + (" --repeats " + " ".join(str(r) for r in repeats) if repeats else "")
        + (f" --forwards {forwards}" if forwards is not None else "")
        + "` from the runs' records (nothing re-timed). Each run is one process; its methods were interleaved "
        "batch by batch (wave by wave) over the same queries; seconds are the batches' (waves') wall time.",
        "",
        *code_lines([*runs, *(repeats or [])]),
        *wave_lines(runs),
        to_markdown(t, floatfmt=".3f"),
        "",
        *picture,
        *repeat_lines(runs, repeats or []),
        *compared,
        *budget_lines(runs),
        *work_lines(runs),
        *cost_lines(forwards),
        *batch_lines(runs),
        *forward_lines(runs),
    ]
    atomic_write_text(out, "\n".join(lines))
    t.to_csv(out.with_suffix(".csv"), index=False)
    return out


# what two runs of the page must share: the target, the data, the limits and the decoding (batch size aside)
COMPARED = (
    "target.model",
    "target.dtype",
    "dataset",
    "decoding.max_new_tokens",
    "decoding.draft_length",
    "decoding.temperature",
    "decoding.top_k",
    "decoding.top_p",
)


def run_identity(run: Path) -> dict:
    """What a run decoded: the ``COMPARED`` settings of its config.yaml and the queries of its records."""
    from omegaconf import OmegaConf

    from specbench.records import CONFIG, EXAMPLES, read_jsonl

    config = Path(run) / CONFIG
    if not config.is_file():
        raise SpecbenchError(
            f"{run} holds no {CONFIG}: not an eval run directory", "pass eval run directories"
        )
    cfg = OmegaConf.load(config)
    found = {k: OmegaConf.to_container(v) if OmegaConf.is_config(v := OmegaConf.select(cfg, k)) else v
             for k in COMPARED}  # fmt: skip
    path = Path(run) / EXAMPLES
    found["queries"] = sorted({str(e.get("query_id")) for e in read_jsonl(path)}) if path.is_file() else []
    return found


def check_comparable(runs: list[Path]) -> None:
    """Refuse runs that did not decode the same queries with the same target, data and limits (batch size aside),
    naming what differs: the page pairs them by batch size and reads ratios across them."""
    first, *rest = [(Path(r), run_identity(r)) for r in runs]
    for run, found in rest:
        mine, theirs = set(first[1]["queries"]), set(found["queries"])
        # a run that stopped before its last queries (or a before run missing one) decoded a part of the same queries
        same_queries = mine <= theirs or theirs <= mine
        differ = [k for k in found if k != "queries" and found[k] != first[1][k]] + (
            [] if same_queries else ["queries"]
        )
        if differ:
            what = "; ".join(
                f"{k}: {len(first[1][k])} vs {len(found[k])} queries ({len(set(first[1][k]) ^ set(found[k]))} differ)"
                if k == "queries"
                else f"{k}: {first[1][k]!r} vs {found[k]!r}"
                for k in differ
            )
            raise SpecbenchError(
                f"{run} did not decode what {first[0]} did ({what}): the page's ratios across runs would compare "
                "other work",
                "pass runs of one experiment that differ only in decoding.batch_size (make batch-throughput writes "
                "them), each finished",
            )


def wave_lines(runs: list[Path]) -> list[str]:
    """How each batched run decoded: waves of queries with the batch size in flight, each finished row's place going
    to the next query (continuous batching: ``rows`` in its ``batches.jsonl``), or static batches (runs before it)."""
    said = []
    for run in map(Path, runs):
        if not (run / BATCHES).is_file():
            continue
        size, waves = batch_size(run), list(read_jsonl(run / BATCHES))
        queries = sorted({len(b["query_ids"]) for b in waves}, reverse=True)
        if any("rows" in b for b in waves) and max(queries) > size:
            said.append(
                f"batch size {size}: waves of {'/'.join(map(str, queries))} queries, {size} in flight, a finished "
                "row's place going to the next query (continuous batching)"
            )
        else:
            said.append(f"batch size {size}: static batches of {'/'.join(map(str, queries))} queries")
    return ["How the runs batched: " + "; ".join(said) + ".", ""] if said else []


def code_lines(runs: list[Path]) -> list[str]:
    """The code the runs came from (``provenance.json``): one commit, or each with its runs."""
    found: dict[str, list[str]] = {}
    for run in runs:
        for key in provenance.commits_under(run):
            found.setdefault(key, []).append(str(run))
    line = provenance.code_line(found)
    return [line, ""] if line else []


def before_lines(runs: list[Path], before: Path) -> list[str]:
    b = before_table(runs, before)
    return [
        "",
        "## Batch 1 against the code before batching",
        "",
        f"This code's batch-1 run against `{before}` (the same queries at batch size 1, run by the code before "
        "batched decoding, in another process), per method both ran: tokens per second of this code over before's, "
        f"paired per query, with its 95% {CI.INTERVAL_TEXT}; within noise when the interval holds 1. The before "
        f"run's code: {', '.join(provenance.commits_under(before)) or 'not recorded'}.",
        "",
        to_markdown(b, floatfmt=".3f") if not b.empty else "No method ran in both.",
        "",
    ]


def budget_lines(runs: list[Path]) -> list[str]:
    b = budget_table(runs)
    if b.empty:
        return []
    return [
        "",
        "## The batch budget's rounds",
        "",
        "Per row and round of the `goodput:<drafter>` methods (the drafter with the batch budget): the draft tokens "
        "verified (the budget's cap, or the draft when shorter) and the tokens the drafter was asked for, the share "
        "of row-rounds verifying none, accepted over expected tokens (its calibration), and measured over predicted "
        "seconds of the forwards (each row's share).",
        "",
        to_markdown(b, floatfmt=".3f"),
        "",
    ]


def batch_lines(runs: list[Path]) -> list[str]:
    b = batch_times(runs)
    if b.empty:
        return []
    return [
        "",
        "## Where each batch's time went",
        "",
        "Per batch (a wave, under continuous batching) and method, in the order they ran (`slot`): wall seconds, "
        "the target forwards' seconds (the "
        "rounds' `t_verify`), drafting's (`t_draft`, `t_select`, `t_switch`), and the rest (the prefill and each "
        "round's bookkeeping); `hf:generate` keeps no rounds, so all its time is the rest. Two methods with the same "
        "forwards and no draft token verified did the same work.",
        "",
        to_markdown(b, floatfmt=".2f"),
        "",
    ]


def work_lines(runs: list[Path]) -> list[str]:
    w = work_table(runs)
    if w.empty:
        return []
    return [
        "",
        "## Tokens a forward and what a forward cost, by batch size",
        "",
        "Per run and method: its target forwards, the rows in a forward, the tokens a forward fed (each row's last "
        "committed token and its draft or tree nodes), the new tokens a forward gave, and its milliseconds (the rows' "
        "shares of the forward, verdicts included). Speculation pays where new tokens a forward grow faster than "
        "the milliseconds do.",
        "",
        to_markdown(w, floatfmt=".2f"),
        "",
    ]


def cost_lines(forwards: Path | None) -> list[str]:
    """The forward-cost measurement (``pipelines/forward_costs.py``) when given: its table by rows, context and query
    tokens, transformers' path beside this engine's, and the copies and memory floor behind them."""
    if forwards is None:
        return []
    t = pd.read_csv(forwards)
    wide = t.pivot_table(
        index=["rows", "context", "q"], columns="path", values=["ms", "MB allocated", "x floor"]
    )
    wide.columns = [f"{a} ({b})" for a, b in wide.columns]
    wide = wide.reset_index()
    return [
        "",
        "## One forward, transformers' path against this engine's",
        "",
        f"From `{forwards}` (`python -m specbench.pipelines.forward_costs`: the same rows fed both ways, alternating; "
        "MB allocated read off one profiled forward; x floor: milliseconds over the memory floor, the bytes a "
        "forward must read over the machine's bandwidth). transformers' path concatenates the whole cache every "
        "forward and copies K and V to every query head when a mask meets more than one query token; this engine "
        "writes the new keys and values in place and packs the query heads.",
        "",
        to_markdown(wide, floatfmt=".2f"),
        "",
    ]


def forward_lines(runs: list[Path]) -> list[str]:
    f = forward_times(runs)
    if f.empty:
        return []
    return [
        "",
        "## What a forward cost",
        "",
        "Per batched run and method, its target forwards by whether they held the whole batch (`full`: the batch "
        "size in flight) or fewer rows (finished rows had left, and no query waited), and whether any row verified a draft token in them: the forwards and their mean "
        "milliseconds. A forward in which no row drafted does the work of a plain batched step; when it costs more in "
        "a drafting method than in `autoregressive`, the difference is what earlier drafts left behind (the masked "
        "slots a round's longest row adds to every other row, until the cache is compacted).",
        "",
        to_markdown(f, floatfmt=".1f"),
        "",
    ]


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m specbench.reproduction.batch_throughput", description=__doc__)
    p.add_argument("runs", nargs="+", type=Path, help="the eval runs, one a batch size")
    p.add_argument("--out", type=Path, required=True, help="the page (Markdown; its .csv and .png beside it)")
    p.add_argument("--before", type=Path, default=None, help="a batch-1 run of the code before batching")
    p.add_argument("--repeats", type=Path, nargs="+", default=[], help="more runs of some batch sizes")
    p.add_argument(
        "--forwards", type=Path, default=None, help="forward_costs.csv (pipelines/forward_costs.py)"
    )
    a = p.parse_args(argv)
    try:
        existing(
            [*a.runs, a.before, *a.repeats, a.forwards],
            "the eval run",
            "run `make batch-throughput` first, or pass "
            "the directories of its runs (outputs/batch_cpu/b<size>)",
        )
        print(write(a.runs, a.out, a.before, a.repeats, a.forwards).read_text(encoding="utf-8"))
    except SpecbenchError as exc:
        exit_on(exc)


if __name__ == "__main__":
    main()
