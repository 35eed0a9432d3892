"""MetaSD's bandit claims on long horizons: replays over acceptance traces of the mixed stream, every verdict
paired per query with its interval, every line labelled replayed.

From one ``specbench trace`` run (``make trace-mixed``: the mixed local stream, 16 queries a task, 512 new tokens
or EOS), five replays (``specbench replay``, run here in-process into ``<out>/<name>``):

- ``bandits``: the single drafters, the per-round oracle, UCB with Block Divergence and with Block Efficiency,
  EXP3, sequential halving, explore-then-commit, the router and tree UCB, ``seeds`` seeds each; Hedge (full
  information) only over a trace with side observations (``trace.side_observations``), else it is judged live only;
- ``switching``: UCB, explore-then-commit and UCB with a switching penalty set from the measured catch-up
  curves (``measured_switch_cost``: a switch's catch-up time in units of a round's reward per second);
- ``stream``: the interleaved stream as one sequence, each selector's statistics carried across its queries (the
  task changes at every query): UCB, discounted UCB, sliding-window UCB;
- ``seed_pool``: MetaSD's own kind of pool, the model drafters the only arms (retrieval left out): UCB-BD per query
  and carried across the stream, against the best single drafter and the per-task oracle;
- ``changing``: each task's queries one after another (``replay.order=by_task``: the best drafter changes between
  long segments), statistics carried, the model drafters only: UCB, explore-then-commit, and discounted and
  sliding-window UCB with memories of ``SEGMENT_MEMORY`` rounds.

Exhibits (``long_horizon.md`` in ``out``): convergence (share of rounds on each query's fastest drafter by
round index), the variance of BD and BE rewards per drafter, regret against the per-query and per-round oracles,
switching costs, non-stationarity, the seed's pool, the changing stream. With ``--live <eval run>`` every replay
charges each kind of round the verification overhead fitted on the live run's rounds (``replay.live``), and the
page carries the calibration of the replay against a live run of the same queries: predicted against measured
seconds per token per method (off by more than 10%: named), the same over the rounds before each generation's
first fork only (where both decode the traced text: the clock alone, whose spread across methods is the clock's
error), the bf16 fork rate (live outputs that leave the traced, autoregressive one) and whether the live run ranks
the bandits as the replay does.

    python -m specbench.reproduction.long_horizon TRACE_RUN OUT [--seeds 100] [--live EVAL_RUN]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench.arms import AUTOREGRESSIVE
from specbench.configs import conf_dir
from specbench.decoding import certify
from specbench.decoding.loop import Limits
from specbench.decoding.replay import Costs, fit_overheads, replay
from specbench.decoding.trace import QueryTrace
from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text
from specbench.pipelines import replay as replay_pipeline
from specbench.pipelines.methods import parse_methods
from specbench.pipelines.tables import to_markdown
from specbench.pipelines.trace import load_traces
from specbench.records import CONVERGENCE_CSV, read_jsonl
from specbench.reproduction import verdicts as V
from specbench.reproduction.runs import CONFIG, EXAMPLES, ROUNDS, SEEDS

REPLAYED = "replayed"
CONVERGENCE = ["ucb-bd", "ucb-be", "exp3-bd", "halving-bd", "hedge-bd"]
# the changing stream: each task's queries one after another (segments of ~1,000-2,500 rounds), the model drafters
# as the only arms; the memories of discounted and sliding-window UCB sized well below a segment
SEGMENT_MEMORY = 200  # rounds: gamma = 1 - 1 / SEGMENT_MEMORY, window = SEGMENT_MEMORY
DUCB_SEGMENT, SWUCB_SEGMENT = f"ducb{SEGMENT_MEMORY}-bd", f"swucb{SEGMENT_MEMORY}-bd"  # their names there
# full information: replayed only over a trace that holds the side observations (else refused: counterfactual)
FULL_INFORMATION = ["selector:hedge"]
BANDITS = [
    "autoregressive",
    "fixed:*",
    "oracle:round",
    "selector:ucb",
    "selector:ucb_be",
    "selector:exp3",
    "selector:sequential_halving",
    "selector:explore_commit",
    "selector:router",
    "selector:tree_ucb",
]
BINS = [(0, 10), (10, 25), (25, 50), (50, 100), (100, 200), (200, 10**9)]
FLAG = 0.10  # a method whose predicted seconds per token are off the live ones by more than this is named
# the calibration column of replay / live seconds over the rounds before each generation's first fork
PREFIX = "rounds before fork: replay / live"
SWITCHING = "switching before fork: replay / live"  # the drafters' catch-up seconds of those rounds
# the leading rounds that equal the replay's (arm, drafted, accepted): there the clock alone differs
EQUAL = "equal rounds: replay / live"


# every verdict's fields (the reproduction report reads them back: load_verdicts)
VERDICTS_DATA = "verdicts_data.json"
SOURCE = "replayed.json"  # what the replays were run over (the trace, its queries and tokens, the arms): the exhibit's notes


def load_verdicts(out: Path) -> list[V.Verdict]:
    """The verdicts :func:`write` judged into ``out`` (its ``verdicts_data.json``), as ``Verdict`` objects again."""
    path = Path(out) / VERDICTS_DATA
    if not path.is_file():
        raise SpecbenchError(
            f"{out} holds no replayed verdicts ({VERDICTS_DATA} is missing)",
            "run `make trace-mixed` (it writes outputs/long_horizon), or "
            "`python -m specbench.reproduction.long_horizon TRACE_RUN OUT` on an existing trace",
        )
    again = "write it again: python -m specbench.reproduction.long_horizon TRACE_RUN OUT"
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise SpecbenchError(f"{path} is damaged ({exc})", again) from None
    # validated by shape, not by what the constructor happens to raise: a non-empty list of verdict objects
    fields = {f.name for f in dataclasses.fields(V.Verdict)}
    required = {f.name for f in dataclasses.fields(V.Verdict) if f.default is dataclasses.MISSING}
    if (
        not isinstance(rows, list)
        or not rows
        or not all(isinstance(r, dict) and required <= set(r) for r in rows)
    ):
        raise SpecbenchError(
            f"{path} is not a list of verdicts (each with {', '.join(sorted(required))}); it holds "
            f"{type(rows).__name__} {str(rows)[:60]}",
            again,
        )
    try:
        return [
            V.Verdict(
                **{
                    k: (tuple(v) if k == "interval" and v is not None else v)
                    for k, v in row.items()
                    if k in fields
                }
            )
            for row in rows
        ]
    except (ValueError, TypeError) as exc:
        raise SpecbenchError(f"{path} is damaged ({exc})", again) from None


def exhibit(out: Path):
    """The reproduction report's exhibit of the replays written into ``out`` (``make trace-mixed``): their verdicts
    (judged with the rest of the report, Holm's correction included), a table of them, the convergence plot, and a
    link to the full replay page (copied beside the exhibit by ``render.write``: ``replay/``)."""
    import shutil

    from specbench.reproduction.exhibit import Exhibit

    out = Path(out)
    verdicts = load_verdicts(out)
    table = pd.DataFrame(
        [
            {
                "claim": v.claim.removeprefix(f"[{REPLAYED}] "),
                "n": v.n,
                "effect": v.effect,
                "label": v.label,
                "ci_low": v.interval[0] if v.interval else None,
                "ci_high": v.interval[1] if v.interval else None,
            }
            for v in verdicts
        ]
    )
    table = table[["claim", "label", "n", "effect", "ci_low", "ci_high"]]
    png = out / "convergence.png"
    notes = (
        f"Replayed, not live: selectors run round by round over {source_text(out)}; the bandit claims judged on "
        "target rounds per query (the stopping time, exact in a greedy replay), the switching claims on times "
        f"predicted from the cost curves measured with the trace; each verdict paired per query with its 95% "
        f"{V.INTERVAL_TEXT}. The full page "
        f"(convergence by round index, reward variance, regret, switching, the carried stream and the calibration "
        f"against a live run): [replay/long_horizon.md](replay/long_horizon.md). Replays in `{out}`."
    )
    return Exhibit(
        "MetaSD's bandit claims on long horizons (replayed over acceptance traces)",
        table,
        verdicts,
        notes,
        plot=(lambda path: shutil.copyfile(png, path)) if png.is_file() else None,
        key="metasd/long_horizon",
        runs=[str(out)],
    )


def compose_replay(overrides: list[str]):
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name="replay", overrides=overrides)


def measured_switch_cost(costs: dict, rows: list[dict]) -> float:
    """A switch's cost in reward units: the heads' mean catch-up over 16 missed tokens divided by a round's time
    (a 5-token verification at the stream's mean context plus 4 head proposals), times the mean reward a round
    earns (Block Divergence of the traced drafts): the reward a round would have to gain to pay for the switch."""
    c = Costs.from_dict(costs)
    traces = [QueryTrace.from_dict(r["trace"]) for r in rows]
    heads = [n for n in c.catch_up if n.startswith("eagle")] or list(c.catch_up)
    if not heads:
        return 0.0
    catch = float(np.mean([c.sync(n, 16) for n in heads]))
    context = float(np.mean([t.prompt_len + t.positions / 2 for t in traces]))
    propose = float(
        np.mean([np.mean(t.drafters[n].t_propose) for t in traces for n in heads if n in t.drafters])
    )
    rnd = c.verify(5, int(context)) + propose
    bd = float(
        np.mean(
            [
                np.mean([sum(o) / max(len(o), 1) for o in t.drafters[n].overlap])
                for t in traces
                for n in heads
                if n in t.drafters
            ]
        )
    )
    return round(catch / rnd * bd, 4)


def side_observed(rows: list[dict]) -> bool:
    """Whether the trace holds every observing drafter's side observations (full information replays exactly)."""
    return all(
        d.get("side") is not None for d in rows[0]["trace"]["drafters"].values() if d.get("observable")
    )


# the bandit methods that need a retrieval drafter among their arms: left out when the arms are named (--arms)
NEEDS_RETRIEVAL = ("selector:router", "selector:tree_ucb")


def run_replays(
    trace_run: Path,
    rows: list[dict],
    out: Path,
    seeds: int,
    switch_cost: float,
    live: Path | None = None,
    arms: list[str] | None = None,
) -> dict[str, Path]:
    """The replays (module docstring) over ``trace_run`` (its trace records ``rows``, already loaded); with ``live``,
    each charges the round overheads fitted on it; Hedge joins the bandits only over a trace with side observations.
    ``arms``: the only drafters every selector plays (the other traced drafters stay as fixed reference rows; the
    router and tree UCB, which need a retrieval arm, are left out); default: every traced drafter, and the model
    drafters for the seed's pool and the changing stream."""
    bandits = BANDITS + (FULL_INFORMATION if side_observed(rows) else [])
    only = [f"+selector_overrides.candidates=[{','.join(arms)}]"] if arms else []
    if arms:
        bandits = [m for m in bandits if m not in NEEDS_RETRIEVAL]
    clock = [f"replay.live={live}"] if live is not None else []
    runs = {
        "bandits": [f"methods=[{','.join(bandits)}]", *only],
        "switching": [
            "methods=[autoregressive,fixed:*,selector:ucb,selector:explore_commit,selector]",
            "selector=ucb_switch",
            f"selector.switch_cost={switch_cost}",
            "selector.name=ucb-switch-measured",
            *only,
        ],
        "stream": [
            "methods=[autoregressive,fixed:*,selector:ucb,selector:discounted_ucb,selector:sliding_window_ucb]",
            "+selector_overrides.carry_over=true",
            *only,
        ],
    }
    models = list(arms) if arms else model_drafters(rows)
    if len(models) > 1:  # the seed's kind of pool: a choice among model drafters
        runs.update(seed_pool_runs(models))
        runs.update(changing_runs(models))
    dirs = {}
    for name, overrides in runs.items():
        d = out / name
        replay_pipeline.run(
            compose_replay([f"traces={trace_run}", f"seeds={seeds}", "overwrite=true", *clock, *overrides]), d
        )
        dirs[name] = d
    return dirs


def model_drafters(rows: list[dict]) -> list[str]:
    """The traced drafters that are models (no retrieval match at any position): the seed's kind of arm."""
    drafters = rows[0]["trace"]["drafters"]
    return [
        n
        for n in drafters
        if not any(m is not None for r in rows for m in r["trace"]["drafters"][n]["match"])
    ]


def seed_pool_runs(arms: list[str]) -> dict[str, list[str]]:
    """MetaSD in the seed's setting: the model drafters as the only arms over the traced (interleaved) stream; UCB-BD
    starting each query afresh and UCB-BD carried across the stream (``ucb_carry``)."""
    fixed = ",".join(["autoregressive", *(f"fixed:{a}" for a in arms)])
    return {
        "seed_pool": [
            f"methods=[{fixed},selector:ucb,selector:ucb_carry]",
            f"+selector_overrides.candidates=[{','.join(arms)}]",
        ]
    }


def changing_runs(arms: list[str]) -> dict[str, list[str]]:
    """The changing stream's replay (task by task, statistics carried, the model drafters as the only arms): UCB,
    explore-then-commit, discounted UCB with a memory of SEGMENT_MEMORY rounds and sliding-window UCB with a window
    of as many (their own overrides: ``selector_overrides.<option>``)."""
    fixed = ",".join(["autoregressive", *(f"fixed:{a}" for a in arms)])
    selectors = "selector:ucb,selector:explore_commit,selector:discounted_ucb,selector:sliding_window_ucb"
    return {
        "changing": [
            f"methods=[{fixed},{selectors}]",
            "replay.order=by_task",
            "+selector_overrides.carry_over=true",
            f"+selector_overrides.candidates=[{','.join(arms)}]",
            f"+selector_overrides.discounted_ucb.gamma={1 - 1 / SEGMENT_MEMORY}",
            f"+selector_overrides.discounted_ucb.name={DUCB_SEGMENT}",
            f"+selector_overrides.sliding_window_ucb.window={SEGMENT_MEMORY}",
            f"+selector_overrides.sliding_window_ucb.name={SWUCB_SEGMENT}",
        ],
    }


# -- per-query columns --------------------------------------------------------------------------------


def per_query(seeds_jsonl: Path) -> pd.DataFrame:
    """Per (method, query): seconds and tokens averaged over seeds, best-arm shares and switches."""
    df = pd.DataFrame(list(read_jsonl(seeds_jsonl)))
    return (
        df.groupby(["method", "query_id", "task"], sort=False)
        .agg(
            seconds=("seconds", "mean"),
            new_tokens=("new_tokens", "mean"),
            rounds=("rounds", "mean"),
            switches=("switches", "mean"),
            best_share=("best_share", "mean"),
            early=("best_share_early", "mean"),
            late=("best_share_late", "mean"),
        )
        .reset_index()
    )


def query_oracle(q: pd.DataFrame) -> pd.DataFrame:
    """Per query, the fastest fixed drafter's row (the per-query oracle)."""
    fixed = q[q.method.str.startswith("fixed:")].copy()
    fixed["spt"] = fixed.seconds / fixed.new_tokens
    return fixed.loc[fixed.groupby("query_id").spt.idxmin()].set_index("query_id")


# What a replayed speed claim is judged on. MetaSD's objective is the stopping time: the fewest target rounds
# (target forwards) to emit the answer, which a greedy replay computes exactly (every method emits the same tokens
# and each round is one target call), so no clock error enters; the wall-clock ratio is printed beside it. Only
# the switching-cost claims, whose cost is time and not rounds, are judged on the clock (with its measured error).
ROUNDS_AXIS = "rounds"
CLOCK_AXIS = "seconds"
AXIS_WHAT = {ROUNDS_AXIS: "tokens per target round ratio", CLOCK_AXIS: "speedup ratio"}


def timed(q: pd.DataFrame, method: str, ids, cost: str = CLOCK_AXIS) -> tuple[list[float], list[float]]:
    """Per query of ``ids``: (``method``'s ``cost``, its new tokens); ``cost`` seconds or rounds."""
    m = q[q.method == method].set_index("query_id").reindex(ids)
    return list(m[cost]), list(m.new_tokens)


def speed_verdict(
    q: pd.DataFrame,
    claim: str,
    a: str,
    b: str | pd.DataFrame,
    threshold: float = 1.0,
    at_least: bool = False,
    names=None,
    cost: str = CLOCK_AXIS,
) -> V.Verdict:
    """``a`` faster than ``b`` (a method, or a per-query frame such as an oracle's) per query, on ``cost``: seconds
    (the replay clock) or target rounds (then the wall-clock ratio of the same pair is printed beside it)."""
    ids = sorted(set(q[q.method == a].query_id))

    def judged(axis: str) -> V.Verdict:
        other = (
            (list(b.reindex(ids)[axis]), list(b.reindex(ids).new_tokens))
            if isinstance(b, pd.DataFrame)
            else timed(q, b, ids, axis)
        )
        pair = names or (a, b if isinstance(b, str) else "oracle")
        return V.faster(claim, timed(q, a, ids, axis), other, pair, threshold, at_least, what=AXIS_WHAT[axis])

    v = judged(cost)
    if cost != CLOCK_AXIS:
        clock = judged(CLOCK_AXIS)
        v = dataclasses.replace(v, detail=f"wall-clock beside, not judged: {clock.stats}")
    return labelled(v)


def labelled(v: V.Verdict) -> V.Verdict:
    return dataclasses.replace(v, claim=f"[{REPLAYED}] {v.claim}")


def share_verdict(q: pd.DataFrame, claim: str, a: str, b: str, column: str) -> V.Verdict:
    pa = q[q.method == a].set_index("query_id")[column]
    pb = q[q.method == b].set_index("query_id")[column]
    ids = sorted(set(pa.dropna().index) & set(pb.dropna().index))
    return labelled(
        V.greater_mean(
            claim,
            list(pa.reindex(ids)),
            list(pb.reindex(ids)),
            f"difference in share of rounds on the best drafter ({a} - {b})",
        )
    )


# -- exhibits -----------------------------------------------------------------------------------------


def convergence_table(run: Path) -> pd.DataFrame:
    conv = pd.read_csv(run / CONVERGENCE_CSV)
    rows = []
    for method, sub in conv.groupby("method", sort=False):
        row = {"method": method}
        for lo, hi in BINS:
            part = sub[(sub["round"] >= lo) & (sub["round"] < hi)]
            label = f"rounds {lo}-{hi - 1}" if hi < 10**9 else f"rounds {lo}+"
            row[label] = float((part.share * part.n).sum() / part.n.sum()) if part.n.sum() else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def plot_convergence(run: Path, path: Path, methods: list[str]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    conv = pd.read_csv(run / CONVERGENCE_CSV)
    fig, ax = plt.subplots(figsize=(7, 4))
    for m in methods:
        sub = conv[(conv.method == m) & (conv.n >= 20)].sort_values("round")
        if len(sub):
            ax.plot(sub["round"], sub.share.rolling(10, min_periods=1).mean(), label=m)
    ax.set_xlabel("round index")
    ax.set_ylabel("share on the query's fastest drafter")
    ax.set_title("Convergence over traces (replayed; 10-round moving mean)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def variance_table(run: Path) -> tuple[pd.DataFrame, list[V.Verdict]]:
    """Per fixed drafter: the variance of the rounds' BD and BE (seed 0: fixed arms are seedless), and per query."""
    rounds = pd.DataFrame(list(read_jsonl(run / ROUNDS)))
    rounds = rounds[rounds.method.str.startswith("fixed:") & (rounds.n_max > 0)]
    rows, parts = [], []
    for method, sub in rounds.groupby("method", sort=False):
        per_q = sub.groupby("query_id").agg(bd=("bd", "var"), be=("be", "var")).dropna()
        rows.append(
            {
                "drafter": method.split(":", 1)[1],
                "rounds": len(sub),
                "mean BD": sub.bd.mean(),
                "var BD": sub.bd.var(),
                "mean BE": sub.be.mean(),
                "var BE": sub.be.var(),
                "var BE / var BD": sub.be.var() / sub.bd.var() if sub.bd.var() else math.nan,
            }
        )
        part = V.greater_mean(
            f"BE rewards vary more than BD rewards within a query ({method})",
            list(per_q.be),
            list(per_q.bd),
            "mean per-query variance difference (BE - BD)",
        )
        parts.append((method.split(":", 1)[1], part))
    # one claim, judged once over every drafter (an intersection-union test: held only when every part holds;
    # its p-value is the largest part's), not once per drafter
    claim = "BE rewards vary more than BD rewards within a query, for every single drafter"
    return pd.DataFrame(rows), [labelled(V.all_of(claim, parts))] if parts else []


def regret_table(q: pd.DataFrame, among: list[str] | None = None) -> tuple[pd.DataFrame, list[V.Verdict]]:
    """Each method's speed against the oracles; the verdict: UCB-BD against the best single drafter (of ``among``,
    the bandits' arms, when given: a reference row no bandit plays is not the best single arm)."""
    oracle = query_oracle(q)
    ar = q[q.method == AUTOREGRESSIVE].set_index("query_id")
    rnd = q[q.method == "oracle:round"].set_index("query_id")
    rows = []
    for method, sub in q.groupby("method", sort=False):
        m = sub.set_index("query_id")
        spt = m.seconds / m.new_tokens
        rows.append(
            {
                "method": method,
                "queries": len(m),
                "speedup": (ar.seconds.reindex(m.index).sum() / ar.new_tokens.reindex(m.index).sum())
                / (m.seconds.sum() / m.new_tokens.sum()),
                "vs per-query oracle": (oracle.seconds / oracle.new_tokens).reindex(m.index).sum() / spt.sum()
                if len(oracle)
                else math.nan,
                "vs per-round oracle": ((rnd.seconds / rnd.new_tokens).reindex(m.index).sum() / spt.sum())
                if len(rnd)
                else math.nan,
                "best share": m.best_share.mean(),
                "switches / query": m.switches.mean(),
                "rounds / query": m.rounds.mean(),
                "tokens / round": m.new_tokens.sum() / m.rounds.sum(),  # the stopping-time axis (MAT)
            }
        )
    # UCB-BD against the per-query oracle is shown (the table's ratio), not judged: the papers give no fraction of
    # the oracle to hold (0.95 was this project's goal in issue 32), and "slower than the oracle" holds by definition.
    claim = f"UCB-BD is faster than the best single drafter over the stream, {IN_ROUNDS}"
    best = best_single(q, ROUNDS_AXIS, among)
    verdicts = [speed_verdict(q, claim, "ucb-bd", best, cost=ROUNDS_AXIS)]
    return pd.DataFrame(rows).dropna(axis=1, how="all"), verdicts


def on_the_clock(v: V.Verdict) -> bool:
    """Whether a replayed verdict is judged on the replay clock (so its measured error can undecide it); a verdict
    on target rounds or on shares is exact in a greedy replay."""
    return v.label.startswith(AXIS_WHAT[CLOCK_AXIS])


IN_ROUNDS = "in target rounds"  # the words a claim judged on the rounds axis ends with


def best_single(q: pd.DataFrame, cost: str = CLOCK_AXIS, among: list[str] | None = None) -> str:
    """The fixed drafter (of ``among``, when given) with the least ``cost`` (seconds, or target rounds) per token
    over all queries."""
    fixed = q[q.method.str.startswith("fixed:")]
    if among:
        fixed = fixed[fixed.method.isin([f"fixed:{a}" for a in among])]
    fixed = fixed.groupby("method")[[cost, "new_tokens"]].sum()
    return str((fixed[cost] / fixed.new_tokens).idxmin())


# -- calibration against a live run -------------------------------------------------------------------


def calibration(trace_run: Path, live_run: Path) -> tuple[pd.DataFrame, dict]:
    """Replay the live eval run's methods over the traces of its queries (same order, same seeds, same limits) and
    compare: predicted / measured seconds per token per method, rounds equal up to the first fork, forks. The
    clock's round overheads are cross-fitted: a query is replayed with the overheads fitted on the live rounds of
    the other half of the queries (alternate queries in the run's order), never on its own."""
    rows, cost_dict = load_traces(trace_run)
    traces = {r["query_id"]: (r, QueryTrace.from_dict(r["trace"])) for r in rows}
    cfg = OmegaConf.load(Path(live_run) / CONFIG)
    live = [e for e in read_jsonl(Path(live_run) / EXAMPLES) if e["query_id"] in traces]
    if not live:
        raise SpecbenchError(
            f"{live_run}: no generation of a traced query", "run eval on the trace's queries"
        )
    live_rounds: dict[tuple[str, str], list[dict]] = {}
    for r in read_jsonl(Path(live_run) / ROUNDS):
        live_rounds.setdefault((r["query_id"], r["method"]), []).append(r)
    first = rows[0]
    methods = parse_methods(cfg.methods, {a: None for a in first["arms"]}, cfg.get("selector"), cfg)
    limits = Limits(
        max_new_tokens=int(cfg.decoding.max_new_tokens), draft_length=int(cfg.decoding.draft_length)
    )
    lengths = replay_pipeline.draft_lengths(compose_replay([f"traces={trace_run}"]), first)
    order = list(dict.fromkeys(e["query_id"] for e in live))
    prompt = {q: qt.prompt_len for q, (_, qt) in traces.items()}
    clock_of, fits = cross_fitted(Costs.from_dict(cost_dict), live_rounds, prompt, order)
    by = {(e["query_id"], e["method"]): e for e in live}
    tally = Tally()
    for m in methods:
        selector = m.make_selector()
        for qid in order:
            if (qid, m.name) in by:
                row, qt = traces[qid]
                gen = replay(qt, selector, limits, clock_of[qid], lengths)
                tally.add(m.name, row, qt, gen, by[(qid, m.name)], live_rounds.get((qid, m.name), []))
    facts = {
        "queries": len(order),
        **tally.facts(),
        "overheads": [replay_pipeline.overheads_text(f) for f in fits],
    }
    return pd.DataFrame(tally.table()), facts


def cross_fitted(
    costs: Costs, live_rounds: dict, prompt: dict[str, int], order: list[str]
) -> tuple[dict, list]:
    """Per query, the clock with the round overheads fitted on the other half of ``order`` (alternate queries), and
    the two halves' fits. ``live_rounds``: (query, method) -> its live rounds; ``prompt``: query -> prompt length."""
    folds = [set(order[0::2]), set(order[1::2])]
    fits = [
        fit_overheads(
            costs,
            [
                (prompt[q], sorted(rs, key=lambda r: r["round"]))
                for (q, _), rs in live_rounds.items()
                if q in f
            ],
        )
        if f
        else {}
        for f in folds
    ]
    clocks = [dataclasses.replace(costs, overheads={k: v for k, (v, _) in f.items()}) for f in fits]
    return {q: clocks[1] if q in folds[0] else clocks[0] for q in order}, fits


class Tally:
    """The calibration's running counts: per method, predicted and measured seconds and tokens; the autoregressive
    outputs' forks from the trace and their tie verdicts; generations whose rounds equal the replay's up to a fork."""

    def __init__(self):
        self.seconds: dict[str, list[float]] = {}  # method -> [predicted s, tokens, measured s, tokens]
        # method -> the same over the rounds before the generation's first fork (both sides decode the traced text)
        self.prefix: dict[str, list[float]] = {}
        # method -> [replayed, live] catch-up seconds of those rounds
        self.switching: dict[str, list[float]] = {}
        # method -> its generation with the lowest before-fork factor, and that factor
        self.lowest: dict[str, tuple[float, str]] = {}
        self.same: dict[
            str, list[float]
        ] = {}  # method -> [replay s, live s, tokens] of its leading equal rounds
        # method -> [trace's prefill s, live s outside rounds, queries]
        self.outside: dict[str, list[float]] = {}
        self.forks: list[int | None] = []
        self.verdicts: dict[str, int] = {}
        self.equal = self.compared = 0

    def add(self, method: str, row: dict, qt: QueryTrace, gen, e: dict, lr: list[dict]) -> None:
        fork = first_fork(e["output_ids"], qt.output)
        if method == AUTOREGRESSIVE:
            self.forks.append(fork)
            judged = certify.classify(
                qt.output[: len(e["output_ids"])],
                row.get("deciders"),
                e["output_ids"],
                e.get("deciders"),
                float(row.get("tie_tolerance") or 0.0),
            )
            if judged is not None:
                self.verdicts[judged.verdict] = self.verdicts.get(judged.verdict, 0) + 1
        mine, theirs = before_fork(gen.rounds, fork), before_fork(lr, fork)
        self.equal += all(
            a["arm"] == b.arm and a["accepted"] == b.accepted and a["drafted"] == b.drafted
            for a, b in zip(theirs, gen.rounds)
        )
        self.compared += 1
        acc = self.seconds.setdefault(method, [0.0, 0.0, 0.0, 0.0])
        for i, x in enumerate((gen.seconds, len(gen.tokens), e["seconds"], e["new_tokens"])):
            acc[i] += x
        (rs, rt), (ls, lt) = round_seconds(mine), round_seconds(theirs)
        pre = self.prefix.setdefault(method, [0.0, 0.0, 0.0, 0.0])
        for i, x in enumerate((rs, rt, ls, lt)):
            pre[i] += x
        if rt and lt and ls > 0:
            factor = (rs / rt) / (ls / lt)
            self.lowest[method] = min(self.lowest.get(method, (math.inf, "")), (factor, e["query_id"]))
        n = same_rounds(theirs, mine)
        same = self.same.setdefault(method, [0.0, 0.0, 0.0])
        for i, x in enumerate((round_seconds(mine[:n])[0], *round_seconds(theirs[:n]))):
            same[i] += x
        switching = self.switching.setdefault(method, [0.0, 0.0])
        for i, rounds in enumerate((mine, theirs)):
            switching[i] += sum(
                float((r.get("t_switch") if isinstance(r, dict) else r.t_switch) or 0.0) for r in rounds
            )
        out = self.outside.setdefault(method, [0.0, 0.0, 0.0])
        for i, x in enumerate((qt.t_prefill, e["seconds"] - round_seconds(lr)[0], 1)):
            out[i] += x

    def table(self) -> list[dict]:
        """Per method (in the order added): seconds per token live and replayed, their ratio, the speedups."""
        out, base = [], {}
        for method, (pred_s, tokens_p, meas_s, tokens_m) in self.seconds.items():
            if not tokens_m:
                continue
            live_spt, rep_spt = meas_s / tokens_m, pred_s / tokens_p
            if method == AUTOREGRESSIVE:
                base = {"live": live_spt, "replay": rep_spt}
            ratio = rep_spt / live_spt
            rep_pre, tokens_pre, live_pre, live_tokens_pre = self.prefix[method]
            pre_ratio = (
                (rep_pre / tokens_pre) / (live_pre / live_tokens_pre)
                if tokens_pre and live_pre and live_tokens_pre
                else math.nan
            )
            prefill, outside, queries = self.outside[method]
            switch_replay, switch_live = self.switching[method]
            out.append(
                {
                    "method": method,
                    "live s/token": live_spt,
                    "replay s/token": rep_spt,
                    "replay / live": ratio,
                    "off by > 10%": "yes" if abs(ratio - 1) > FLAG else "",
                    "live speedup": base.get("live", math.nan) / live_spt,
                    "replay speedup": base.get("replay", math.nan) / rep_spt,
                    "tokens before fork": int(live_tokens_pre),
                    PREFIX: pre_ratio,
                    SWITCHING: switch_replay / switch_live if switch_live > 0 else math.nan,
                    EQUAL: self.same[method][0] / self.same[method][1] if self.same[method][1] else math.nan,
                    "tokens of equal rounds": int(self.same[method][2]),
                    "lowest generation before fork": "{:.3f} ({})".format(*self.lowest[method])
                    if method in self.lowest
                    else "",
                    "outside rounds: replay / live": prefill / outside if outside > 0 else math.nan,
                    "live s outside rounds": outside / queries,
                }
            )
        return out

    def facts(self) -> dict:
        return {
            "forked": sum(f is not None for f in self.forks),
            "ar_generations": len(self.forks),
            "fork_positions": [f for f in self.forks if f is not None],
            "rounds_equal_to_fork": self.equal,
            "generations_compared": self.compared,
            "fork_verdicts": self.verdicts,
        }


def before_fork(rounds: list, fork: int | None) -> list:
    """The leading rounds (live records or replayed ``Round``s) whose tokens all lie before position ``fork`` of
    the output (all of them without a fork): on those the live run and the replay decode the same text."""
    out, emitted = [], 0
    for r in rounds:
        emitted += r["emitted"] if isinstance(r, dict) else r.emitted
        if fork is not None and emitted > fork:
            break
        out.append(r)
    return out


def same_rounds(live: list[dict], replayed: list) -> int:
    """How many leading rounds of a live generation equal the replay's: same arm, drafted and accepted tokens."""
    n = 0
    for a, b in zip(live, replayed):
        if (a["arm"], a["drafted"], a["accepted"]) != (b.arm, b.drafted, b.accepted):
            break
        n += 1
    return n


def round_seconds(rounds: list) -> tuple[float, int]:
    """Total seconds (selection, drafting, verification, switching) and tokens of ``rounds``: live records or
    replayed ``Round``s."""
    keys = ("t_select", "t_draft", "t_verify", "t_switch", "emitted")
    rows = [
        [float((r.get(k) if isinstance(r, dict) else getattr(r, k)) or 0.0) for k in keys] for r in rounds
    ]
    return sum(sum(x[:4]) for x in rows), int(sum(x[4] for x in rows))


def swapped(table: pd.DataFrame) -> list[tuple[str, str]]:
    """Pairs of methods that the live and the replayed speedups order differently."""
    rows = table.to_dict("records")
    return [
        (a["method"], b["method"])
        for i, a in enumerate(rows)
        for b in rows[i + 1 :]
        if (a["live speedup"] - b["live speedup"]) * (a["replay speedup"] - b["replay speedup"]) < 0
    ]


def first_fork(a: list[int], b: list[int]) -> int | None:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) <= len(b) else n


# -- the report -----------------------------------------------------------------------------------------


def write(
    trace_run: Path, out: Path, seeds: int = 100, live: Path | None = None, arms: list[str] | None = None
) -> Path:
    """Replay the bandits, switching and stream methods over ``trace_run``'s traces into ``out`` and write
    ``long_horizon.md`` with its verdicts (``verdicts.json``, ``verdicts_data.json``); ``live``: a live run of the
    same queries to calibrate the replay against; ``arms``: the only drafters the selectors play (``run_replays``)."""
    trace_run, out = Path(trace_run), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows, costs = load_traces(trace_run)
    check_arms(arms, rows)
    switch_cost = measured_switch_cost(costs, rows)
    dirs = run_replays(trace_run, rows, out, seeds, switch_cost, live, arms)
    lines = header_lines(trace_run, rows, seeds)
    judged: list[V.Verdict] = []
    cal = calibration(trace_run, live) if live is not None else None
    error = clock_error(cal[0]) if cal is not None else math.nan
    q = per_query(dirs["bandits"] / SEEDS)
    for section, verdicts in (
        convergence_section(dirs["bandits"], q, out),
        verdict_section(
            "## Reward variance: Block Divergence against Block Efficiency, per drafter (fixed arms)",
            *variance_table(dirs["bandits"]),
        ),
        verdict_section(
            "## Regret against the per-query and per-round oracles", *regret_table(q, arms), REGRET_NOTE
        ),
        switching_section(dirs["switching"], switch_cost),
        stream_section(dirs["stream"]),
        *(
            [seed_pool_section(dirs["seed_pool"]), changing_section(dirs["changing"])]
            if "changing" in dirs
            else []
        ),
    ):
        for v in verdicts:  # a speed verdict inside the clock's measured error is inconclusive
            w = V.inside_error(v, error, "the replay clock's measured error") if on_the_clock(v) else v
            if w is not v:
                section = [f"- {w.line()}" if line == f"- {v.line()}" else line for line in section]
            judged.append(w)
        lines += section
    if cal is not None:
        lines += calibration_section(trace_run, live, cal, error)
    text = "\n".join(lines)
    atomic_write_text(out / "long_horizon.md", text + "\n")
    atomic_write_text(out / "verdicts.json", json.dumps([v.line() for v in judged], indent=1))
    atomic_write_text(out / VERDICTS_DATA, json.dumps([dataclasses.asdict(v) for v in judged], indent=1))
    atomic_write_text(out / SOURCE, json.dumps(source(trace_run, rows, arms), indent=1))
    print(text)
    return out / "long_horizon.md"


REGRET_NOTE = (
    "Ratios are total seconds per token of the oracle over the method's on the same queries (1: as fast as the "
    "oracle). The per-round oracle picks, each round in hindsight, the arm with the most tokens per second of that "
    "round (catch-up included); greedy round by round, it can trail the per-query oracle when switching costs."
)


def source(trace_run: Path, rows: list[dict], arms: list[str] | None) -> dict:
    """What the replays ran over: the trace run, its queries per task, its token limit and the selectors' arms."""
    return {
        "trace": str(trace_run),
        "queries": len(rows),
        "tasks": pd.Series([r["task"] for r in rows]).value_counts().to_dict() if rows else {},
        "max_new_tokens": rows[0]["trace"]["max_new_tokens"] if rows else None,
        "arms": arms,
    }


def source_text(out: Path) -> str:
    """The exhibit's words for what was replayed (its ``replayed.json``; older replay directories lack it)."""
    path = Path(out) / SOURCE
    if not path.is_file():
        return "acceptance traces of the mixed stream (`make trace-mixed`: 16 queries a task, up to 512 new tokens)"
    found = json.loads(path.read_text(encoding="utf-8"))
    tasks = ", ".join(f"{t}: {n}" for t, n in found.get("tasks", {}).items())
    arms = found.get("arms")
    return (
        f"acceptance traces of {found['queries']} queries ({tasks}; `{found['trace']}`), up to "
        f"{found.get('max_new_tokens')} new tokens, "
        + (f"the selectors' arms {', '.join(arms)} (every other traced drafter a reference row)" if arms else
           "every traced drafter an arm")
    )  # fmt: skip


def agreeing(page: str, verdicts: list[V.Verdict]) -> str:
    """The replay page ``page`` with each verdict line replaced by the report's line for the same claim (``verdicts``:
    the report's, after the statements' judging, Holm's correction and a stability check), so the copy the report
    publishes says what the report says."""
    final = {v.claim: v.line() for v in verdicts}
    out = []
    for line in page.splitlines():
        if line.startswith("- **"):
            claim = next((c for c in final if line.split("**: ", 1)[-1].startswith(c + " (")), None)
            line = f"- {final[claim]}" if claim is not None else line
        out.append(line)
    note = (
        "> The verdict lines below are the reproduction report's: each a part of one statement, judged and "
        "corrected there (REPORT.md)."
    )
    return "\n".join(out[:1] + ["", note] + out[1:]) + "\n"


def header_lines(trace_run: Path, rows: list[dict], seeds: int) -> list[str]:
    """The page's title, what was replayed, and the trace's own summary."""
    positions = sum(len(r["output_ids"]) for r in rows)
    tasks = pd.Series([r["task"] for r in rows]).value_counts().to_dict()
    trace_md = (trace_run / "trace.md").read_text() if (trace_run / "trace.md").exists() else ""
    lines = [
        f"# MetaSD's bandit claims on long horizons (replayed over traces of {trace_run})",
        "",
        f"{len(rows)} traced queries ({', '.join(f'{t}: {n}' for t, n in tasks.items())}), {positions:,} output "
        f"positions, up to {rows[0]['trace']['max_new_tokens']} new tokens or EOS; {seeds} seeds per randomized "
        "selector (EXP3, and Hedge where the trace holds side observations; UCB and its variants, sequential halving, explore-then-commit, the router and tree "
        "UCB are deterministic: one replay stands for every seed). "
        "Every line below is **replayed**: selectors run round by round over the traces, times predicted from "
        "the cost curves measured with the trace (same dtype, threads). Verdicts are paired per query (seconds "
        f"and shares averaged over seeds first) with 95% {V.INTERVAL_TEXT}s.",
        "",
    ]
    if trace_md:
        lines += ["## The trace", "", trace_md.split("\n", 2)[2].strip(), ""]
    return lines


def verdict_section(
    title: str, table: pd.DataFrame, verdicts: list[V.Verdict], note: str = ""
) -> tuple[list[str], list[V.Verdict]]:
    """A section: its title, an optional note, its table and its verdicts."""
    lines = [title, ""] + ([note, ""] if note else []) + [to_markdown(table), "", "### Verdicts", ""]
    return lines + [f"- {v.line()}" for v in verdicts] + [""], list(verdicts)


def convergence_section(run: Path, q: pd.DataFrame, out: Path) -> tuple[list[str], list[V.Verdict]]:
    """Share of rounds on each query's fastest drafter by round index (and its plot), BD against BE, EXP3 and
    sequential halving."""
    conv = convergence_table(run)
    lines = [
        "## Convergence: share of rounds on each query's fastest drafter, by round index",
        "",
        to_markdown(conv[conv.method.isin(CONVERGENCE + ["router", "tree_ucb-bd", "etc-bd"])]),
        "",
    ]
    if plot_convergence(run, out / "convergence.png", CONVERGENCE):
        lines += ["![convergence](convergence.png)", ""]
    early = "UCB-BD plays the best drafter more often than {} in the first 100 rounds"
    verdicts = [
        share_verdict(q, early.format("UCB-BE"), "ucb-bd", "ucb-be", "early"),
        share_verdict(q, early.format("EXP3"), "ucb-bd", "exp3-bd", "early"),
        share_verdict(q, early.format("sequential halving"), "ucb-bd", "halving-bd", "early"),
        share_verdict(
            q,
            "UCB-BD plays the best drafter more often than UCB-BE from round 100 on",
            "ucb-bd",
            "ucb-be",
            "late",
        ),
    ]
    return lines + ["### Verdicts", ""] + [f"- {v.line()}" for v in verdicts] + [""], verdicts


def switching_section(run: Path, switch_cost: float) -> tuple[list[str], list[V.Verdict]]:
    """Explore-then-commit and the measured switching penalty against UCB-BD when switches cost their catch-up."""
    qs = per_query(run / SEEDS)
    sw = regret_table(qs)[0]
    verdicts = [
        speed_verdict(
            qs,
            "Explore-then-commit is faster than UCB-BD when switches cost their catch-up",
            "etc-bd",
            "ucb-bd",
        ),
        speed_verdict(
            qs,
            "UCB with the measured switching penalty is faster than plain UCB-BD",
            "ucb-switch-measured",
            "ucb-bd",
        ),
    ]
    note = (
        f"Every switch costs the new drafter its catch-up over the tokens it missed (the measured catch-up curves). "
        f"The penalty of `ucb-switch-measured` is {switch_cost} reward units: the heads' catch-up over 16 tokens "
        "divided by a round's time, times the mean reward of a round."
    )
    table = sw[sw.method.isin(["ucb-bd", "etc-bd", "ucb-switch-measured"])]
    return verdict_section("## Switching costs", table, verdicts, note)


def stream_section(run: Path) -> tuple[list[str], list[V.Verdict]]:
    """Discounted and sliding-window UCB against UCB on the interleaved stream carried as one sequence."""
    qn = per_query(run / SEEDS)
    st = regret_table(qn)[0]
    changing = "{} is faster than UCB on a stream whose task changes at every query, " + IN_ROUNDS
    verdicts = [
        speed_verdict(qn, changing.format("Discounted UCB"), "ducb-bd", "ucb-bd", cost=ROUNDS_AXIS),
        speed_verdict(qn, changing.format("Sliding-window UCB"), "swucb-bd", "ucb-bd", cost=ROUNDS_AXIS),
    ]
    title = (
        "## Non-stationarity: the interleaved stream as one sequence (statistics carried; the task changes at "
        "every query)"
    )
    return verdict_section(title, st[~st.method.str.startswith("fixed:")], verdicts)


def task_oracle(q: pd.DataFrame) -> pd.DataFrame:
    """Per query, the row of its task's fastest fixed drafter over the task's queries (the per-task oracle: one arm
    per task, chosen in hindsight)."""
    fixed = q[q.method.str.startswith("fixed:")]
    totals = fixed.groupby(["task", "method"])[["seconds", "new_tokens"]].sum()
    best = (totals.seconds / totals.new_tokens).groupby(level="task").idxmin()
    chosen = {task: method for task, (_, method) in best.items()}
    return fixed[fixed.method == fixed.task.map(chosen)].set_index("query_id")


def seed_pool_section(run: Path) -> tuple[list[str], list[V.Verdict]]:
    """UCB-BD on the seed's kind of pool (model drafters only) against the best single drafter, with its ratio to the
    per-task and per-query oracles shown."""
    q = per_query(run / SEEDS)
    st = regret_table(q)[0]
    per_task = task_oracle(q)
    task_spt = per_task.seconds / per_task.new_tokens
    st["vs per-task oracle"] = [  # as the per-query oracle's column: summed per-query seconds per token
        task_spt.reindex(m.index).sum() / (m.seconds / m.new_tokens).sum()
        for m in (q[q.method == name].set_index("query_id") for name in st.method)
    ]
    best = best_single(q, ROUNDS_AXIS)
    claim = "UCB-BD{} is faster than the best single drafter on the seed's kind of pool, " + IN_ROUNDS
    verdicts = [
        speed_verdict(q, claim.format(""), "ucb-bd", best, cost=ROUNDS_AXIS),
        speed_verdict(q, claim.format(" carried across the stream"), "ucb-bd-carry", best, cost=ROUNDS_AXIS),
    ]
    title = "## MetaSD on the seed's kind of pool (model drafters only, the traced stream)"
    note = (
        f"The model drafters are the only arms (retrieval left out, as the seed's pool has none); the best single "
        f"drafter over the stream (the fewest target rounds per token) is {best.removeprefix('fixed:')}. The per-task oracle plays, on each task, the "
        "drafter fastest over that task's queries (in hindsight); its ratio and the per-query oracle's are shown, "
        "not judged (slower than an oracle holds by definition). ucb-bd starts each query afresh (the seed's "
        "per-query play); ucb-bd-carry keeps its statistics across the stream." + seed_pool_cause(st)
    )
    return verdict_section(title, st, verdicts, note)


def seed_pool_cause(st: pd.DataFrame) -> str:
    """What the table measures about why UCB-BD trails the best single drafter on this pool (empty without it)."""
    rows = st.set_index("method")
    if "ucb-bd" not in rows.index:
        return ""
    ucb, single = rows.loc["ucb-bd"], rows[rows.index.str.startswith("fixed:")]
    text = (
        f" Measured cause: the {len(single)} heads run within {single.speedup.min():.3f}-{single.speedup.max():.3f}x "
        f"autoregressive, so their reward gaps are small, and ucb-bd, reset at every query, switches drafters on "
        f"{ucb['switches / query']:.0f} of its {ucb['rounds / query']:.0f} rounds a query and plays each query's "
        f"fastest drafter on {ucb['best share']:.0%} of them: it is still exploring when a query ends, paying a "
        "catch-up at nearly every round."
    )
    if "ucb-bd-carry" in rows.index:
        carry = rows.loc["ucb-bd-carry"]
        text += (
            f" Carried across the stream it switches {carry['switches / query']:.0f} times a query and runs at "
            f"{carry.speedup:.3f}x."
        )
    return text


def changing_section(run: Path) -> tuple[list[str], list[V.Verdict]]:
    """Discounted and sliding-window UCB (memories of SEGMENT_MEMORY rounds) against UCB and explore-then-commit on
    the changing stream: each task's queries one after another, statistics carried, the model drafters only."""
    q = per_query(run / SEEDS)
    ducb, swucb = DUCB_SEGMENT, SWUCB_SEGMENT
    claim = "{} is faster than UCB on a stream whose best drafter changes between task segments, " + IN_ROUNDS
    share = "{} plays each query's best model drafter on more of its rounds than UCB on the changing stream"
    verdicts = [
        speed_verdict(q, claim.format("Discounted UCB"), ducb, "ucb-bd", cost=ROUNDS_AXIS),
        speed_verdict(q, claim.format("Sliding-window UCB"), swucb, "ucb-bd", cost=ROUNDS_AXIS),
        share_verdict(q, share.format("Discounted UCB"), ducb, "ucb-bd", "best_share"),
        share_verdict(q, share.format("Sliding-window UCB"), swucb, "ucb-bd", "best_share"),
    ]
    title = (
        f"## Non-stationarity: a stream whose best drafter changes (task segments, model drafters only, memories of "
        f"{SEGMENT_MEMORY} rounds)"
    )
    note = (
        "Each task's traced queries one after another, every selector's statistics carried across them, the model "
        "drafters the only arms (retrieval left out: it would be the best arm nearly everywhere). Each segment's "
        "best drafter (the fixed drafter fastest over the segment's queries): "
        + segment_bests(q)
        + f". Discounted UCB's gamma is 1 - 1/{SEGMENT_MEMORY} and sliding-window UCB's window {SEGMENT_MEMORY} "
        "rounds, well below a segment; explore-then-commit, with its statistics carried, explores once and then "
        "commits at each query to the best carried mean."
    )
    st = regret_table(q)[0]
    return verdict_section(title, st, verdicts, note)


def segment_bests(q: pd.DataFrame) -> str:
    """Per task, in stream order: the fixed drafter with the fewest seconds per token over the task's queries."""
    fixed = q[q.method.str.startswith("fixed:")]
    out = []
    for task, sub in fixed.groupby("task", sort=False):
        spt = sub.groupby("method").seconds.sum() / sub.groupby("method").new_tokens.sum()
        out.append(f"{task}: {spt.idxmin().removeprefix('fixed:')}")
    return ", ".join(out)


def error_column(cal: pd.DataFrame) -> str:
    """The calibration column the clock's error is read from: the before-fork factors where at least two methods
    have one, else the whole generations'."""
    return PREFIX if PREFIX in cal and cal[PREFIX].notna().sum() > 1 else "replay / live"


def clock_error(cal: pd.DataFrame) -> float:
    """The replay clock's measured error on a speed ratio: how far apart its replay / live factors of two methods can
    be (the largest over the smallest, less 1), nan without two methods. The factors are those of the rounds before
    each generation's first fork where the table has them (both sides decode the same text there, so only the
    clock differs), else those of whole generations."""
    ratios = cal[error_column(cal)].dropna() if len(cal) else pd.Series(dtype=float)
    return float(ratios.max() / ratios.min() - 1) if len(ratios) > 1 else math.nan


def calibration_section(trace_run: Path, live: Path, cal=None, error: float = math.nan) -> list[str]:
    """The replay against a live run of the same queries: forks, rounds equal before them, speedups, ranking, and
    the clock's error on a speed ratio (``error``: :func:`clock_error`)."""
    cal, facts = cal if cal is not None else calibration(trace_run, live)
    fp = facts["fork_positions"]
    forks = (
        f" (at positions {', '.join(map(str, sorted(fp)))}; judged against the run's tie tolerance: "
        + ", ".join(f"{n} {v}" for v, n in sorted(facts["fork_verdicts"].items()))
        + ")"
        if fp
        else ""
    )
    lines = [
        "## Calibration against a live run of the same queries",
        "",
        f"Live run {live} ({facts['queries']} queries). The replay re-runs each of its methods with the same "
        "seed, queries and limits over the traces. bf16 forks: the live autoregressive output left the traced "
        f"one in {facts['forked']} of {facts['ar_generations']} queries{forks}; rounds before the first "
        f"fork equal the replay's (arm, drafted, accepted) in {facts['rounds_equal_to_fork']} of "
        f"{facts['generations_compared']} generations.",
        "",
        "Each query's replay is charged the verification overheads beyond the cost curve fitted on the live rounds "
        "of the other half of these queries (cross-fitted; the replays above use the fit on all of them): "
        + "; ".join(
            f"half {i + 1}: {text or 'no rounds'}" for i, text in enumerate(facts.get("overheads", []))
        )
        + ".",
        "",
        to_markdown(cal),
        "",
    ]
    return lines + calibration_reading() + clock_error_lines(cal, error) + ranking_lines(cal)


def calibration_reading() -> list[str]:
    """How to read the calibration table's factors."""
    return [
        "Two factors per method: `replay / live` over whole generations (prefill included) mixes the clock with the "
        "text: after a bf16 fork the live run decodes a different, equally valid continuation than the trace, and "
        "prompt lookup and the router's speed depend most on how repetitive that text is. "
        f"`{PREFIX}` compares only the rounds before the generation's first fork (`tokens before fork` of them), "
        "where both sides decode the traced text, so only the clock differs; `switching before fork` is the part "
        "of those rounds' seconds that the drafters' catch-up after a switch takes (the trace's catch-up curve "
        "against the live run's), and `lowest generation` the one generation whose before-fork factor is lowest; "
        f"`{EQUAL}` compares only the leading rounds that equal the replay's (same arm, drafted and accepted "
        "tokens: `tokens of equal rounds` of them), where nothing but the clock can differ. Before the fork the "
        "two can still part: the heads' bf16 rewards round differently from the trace's, a selector that reads "
        "them may choose another arm, and the rounds that follow differ (the before-fork factor carries that, "
        "the equal-rounds one does not); `outside rounds` compares the trace's "
        "prefill with the live seconds outside the rounds (prefill and the loop's set-up, the same for every "
        "method). The forked texts' differences are per-query variation, which the verdicts' intervals over the "
        "traced queries already carry; the clock's own error is the spread of the before-fork factors.",
        "",
    ]


def clock_error_lines(cal, error: float) -> list[str]:
    """The clock's error on a replayed speed ratio (``error``), and the equal rounds' narrower range."""
    lines: list[str] = []
    if math.isfinite(error):
        column = error_column(cal)
        lines += [
            f"The clock's error on a replayed speed ratio: the `{column}` factors above lie within a factor "
            f"{1 + error:.3f} of each other, so a replayed speed verdict whose effect lies within {error:.1%} of its "
            "threshold is **inconclusive** (the clock could have made it), whatever its interval says.",
            "",
        ]
        if EQUAL in cal and cal[EQUAL].notna().sum() > 1:
            low, high = cal[EQUAL].min(), cal[EQUAL].max()
            lines += [
                f"That error is conservative: it also holds the selectors' own parting before the fork. Over the "
                f"equal rounds alone the factors lie between {low:.3f} and {high:.3f}.",
                "",
            ]
    return lines


def ranking_lines(cal: pd.DataFrame) -> list[str]:
    """Whether the live run ranks the calibration's adaptive methods as the replay does (Spearman, swapped pairs)."""
    lines: list[str] = []
    adaptive = cal[(cal.method != AUTOREGRESSIVE) & ~cal.method.str.startswith("fixed:")]
    if len(adaptive) > 1:
        agree = list(adaptive.sort_values("live speedup", ascending=False).method) == list(
            adaptive.sort_values("replay speedup", ascending=False).method
        )
        rho = float(adaptive["live speedup"].rank().corr(adaptive["replay speedup"].rank()))
        ranks = (
            "the live run ranks them exactly as the replay does"
            if agree
            else ("the live run ranks them differently from the replay")
        )
        lines += [
            f"Ranking of the {len(adaptive)} adaptive methods by speedup: {ranks} (Spearman rank correlation "
            f"{rho:.2f}); pairs whose order differs: "
            + (", ".join(f"{a} / {b}" for a, b in swapped(adaptive)) or "none")
            + ".",
            "",
        ]
    return lines


def check_arms(arms: list[str] | None, rows: list[dict]) -> None:
    """Refuse arms the trace did not trace (naming those it did), and fewer than two (nothing to select)."""
    if arms is None:
        return
    traced = list(rows[0]["trace"]["drafters"]) if rows else []
    unknown = [a for a in arms if a not in traced]
    if unknown or len(set(arms)) < 2:
        raise SpecbenchError(
            f"--arms {','.join(arms)}: "
            + (f"not traced: {', '.join(unknown)}" if unknown else "a selection needs at least two arms"),
            f"name two or more of the traced drafters: {', '.join(traced)}",
        )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace_run")
    p.add_argument("out")
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--live", default=None, help="a `specbench eval` run of the traced queries (calibration)")
    p.add_argument(
        "--arms", default=None, help="a,b,...: the only drafters the selectors play (the rest: references)"
    )
    a = p.parse_args(argv)
    arms = [x for x in a.arms.split(",") if x] if a.arms else None
    try:
        write(Path(a.trace_run), Path(a.out), a.seeds, Path(a.live) if a.live else None, arms)
    except SpecbenchError as exc:
        raise SystemExit(f"error: {exc.problem}\nfix:   {exc.fix}") from None


if __name__ == "__main__":
    main()
