"""``specbench replay``: selectors judged over acceptance traces (``specbench trace``), many seeds each, in seconds.

Every method of ``methods`` (as eval's: autoregressive, fixed:<arm>, fixed:*, tree:..., selector, selector:<name>;
plus ``oracle:round``, the per-round hindsight oracle) is replayed over every traced query
(``decoding/replay.py``), ``seeds`` times for a randomized selector (``Selector.randomized``: EXP3, Hedge,
epsilon-greedy, random; each seed shifts its ``seed``); the others are deterministic, every seed giving the same
rounds (tested), and are replayed once. Selectors are made once per (method, seed) and
``reset`` per query in the traces' order, as eval makes them; ``selector_overrides: {carry_over: true}`` keeps
their statistics across the queries (on an interleaved stream, a task that changes at every query).

Written to the run directory (every record says ``replayed: true``):

- ``examples.jsonl`` and ``rounds.jsonl``: seed 0, in eval's fields (times predicted by the trace's cost
  curves), and ``summary.csv`` / ``summary.md`` made from them by eval's own tables;
- ``seeds.jsonl``: one line per (method, seed, query); ``seeds.csv`` / ``seeds.md``: per method, over seeds
  and queries: speedup against autoregressive, the ratio to the per-query oracle (each query's fastest
  fixed drafter) and to the per-round oracle, the share of rounds on the query's best drafter (all rounds,
  and rounds from index 100 on), switches and rounds per query;
- ``convergence.csv``: per method and round index, the share of (seed, query) runs on the query's best drafter.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import pandas as pd
from omegaconf import DictConfig
from tqdm.auto import tqdm

from specbench import profiling
from specbench.arms import AUTOREGRESSIVE
from specbench.decoding.loop import Limits
from specbench.decoding.replay import RoundOracle, replay
from specbench.decoding.replay_costs import ROUND_KINDS, SWITCH, Costs, fit_overheads
from specbench.decoding.trace import QueryTrace
from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text
from specbench.pipelines import tables
from specbench.pipelines.methods import Method, load_selector_config, parse_methods
from specbench.pipelines.session.run_dir import RunFiles, start_run
from specbench.pipelines.trace import load_traces
from specbench.records import (
    CONVERGENCE_CSV,
    EXAMPLES,
    ROUNDS,
    SEEDS,
    SEEDS_CSV,
    JsonlWriter,
    read_jsonl,
    round_row,
)
from specbench.selection.base import context_aware
from specbench.validate import COUNT, PATH, Rule, boolean, integer, text

# the orders queries can be replayed in: the trace's own, or its tasks one after another (each task's queries in the
# trace's order): a stream whose best drafter changes between long segments, under carried statistics
TRACED, BY_TASK = "traced", "by_task"
ORDERS = (TRACED, BY_TASK)


ORDER = Rule(lambda v: v in ORDERS, " or ".join(ORDERS), note=" (the order queries are replayed in)")


@dataclass(frozen=True, kw_only=True)
class ReplaySettings:
    """replay.* (conf/replay.yaml holds the defaults)."""

    max_new_tokens: Annotated[int | None, integer(1, null=True, note=" (null: the trace's)")]
    draft_length: Annotated[int | None, integer(1, null=True, note=" (null: the trace run's)")]
    partial: Annotated[bool, boolean()]
    live: Annotated[str | None, text(null=True)]
    counterfactual: Annotated[bool, boolean()]
    order: Annotated[str, ORDER]


@dataclass(frozen=True, kw_only=True)
class ReplayInputs:
    """The command's own inputs: the trace run(s) to replay and how many seeds each method is replayed with."""

    traces: Annotated[str | None, PATH]
    seeds: Annotated[int, COUNT]


SECTIONS: dict[str, tuple[type, ...]] = {"replay": (ReplaySettings,), "": (ReplayInputs,)}

log = logging.getLogger(__name__)

FILES = RunFiles(results=(EXAMPLES, ROUNDS, SEEDS))
ORACLE_ROUND = "oracle:round"
LATE = 100  # the share on the best arm is also reported from this round index on


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    out = start_run(cfg, output_dir, FILES, "replay", SECTIONS)
    rows, cost_dict = load_traces(cfg.traces, partial=bool(cfg.replay.get("partial")))
    rows = ordered(rows, cfg.replay.get("order") or TRACED)
    costs = costs_of(cfg, cost_dict)
    fitted = {}
    if cfg.replay.get("live"):
        fitted = fit_from_live(costs, cfg.replay.live, rows)
        costs = dataclasses.replace(costs, overheads={k: s for k, (s, _) in fitted.items()})
        log.info("replay: verification overheads fitted on %s: %s", cfg.replay.live, overheads_text(fitted))
    first = rows[0]
    arms = list(first["arms"])
    for r in rows:
        if list(r["arms"]) != arms:
            raise SpecbenchError(
                f"{cfg.traces}: trace records of different pools ({r['arms']} against {arms})",
                "replay one trace run (one pool)",
            )
    lengths = draft_lengths(cfg, first)
    limits = Limits(
        max_new_tokens=int(cfg.replay.max_new_tokens or first["trace"]["max_new_tokens"]),
        draft_length=int(cfg.replay.draft_length or first["draft_length"]),
    )
    specs = [str(m) for m in cfg.methods]
    refuse_context_aware(specs, cfg)
    methods = parse_methods(
        [m for m in specs if m != ORACLE_ROUND], {a: None for a in arms}, cfg.get("selector"), cfg
    )
    if not cfg.replay.get("counterfactual"):
        refuse_counterfactual(methods, rows, cfg.traces)
    if ORACLE_ROUND in specs:
        methods.append(Method(ORACLE_ROUND, lambda: RoundOracle(arms)))
    for f in FILES.results:
        (out / f).unlink(missing_ok=True)
    t_start = time.perf_counter()
    per_seed, convergence, n_rounds = replay_all(
        out, rows, methods, arms, int(cfg.seeds), (limits, costs, lengths)
    )
    elapsed = time.perf_counter() - t_start
    log.info("replayed %d rounds in %.1f s (%.0f rounds/s)", n_rounds, elapsed, n_rounds / max(elapsed, 1e-9))
    write_outputs(out, per_seed, convergence, rows, n_rounds, elapsed, cfg, fitted)
    return out


def ordered(rows: list[dict], order: str) -> list[dict]:
    """The traced queries in the replay's ``order`` (``ORDERS``): as traced, or grouped by task (tasks in the order of
    their first query, each task's queries as traced)."""
    if order == TRACED:
        return rows
    first = {task: i for i, task in reversed(list(enumerate(r["task"] for r in rows)))}
    return sorted(rows, key=lambda r: first[r["task"]])


def refuse_counterfactual(methods: list[Method], rows: list[dict], traces) -> None:
    """A full-information selector over a trace without side observations would replay with observations live never
    had (each observer's own draft's Block Divergence) and pay nothing for them: refused unless asked for."""
    blind = [
        n for n, d in rows[0]["trace"]["drafters"].items() if d.get("observable") and d.get("side") is None
    ]
    if not blind:
        return
    for m in methods:
        if getattr(m.make_selector(), "full_information", False):
            raise SpecbenchError(
                f"method '{m.name}' learns from full information, but {traces} holds no side observations for "
                f"{', '.join(blind)}: its replay would see better information than live, at no cost",
                "trace with trace.side_observations=true, evaluate it live, or replay it anyway with "
                "replay.counterfactual=true (the output counts its counterfactual observations)",
            )


def live_queries(live: str | Path, rows: list[dict], ids=None) -> list[tuple[int, list[dict]]]:
    """Per generation of the eval run ``live`` of a traced query (of ``ids`` when given): the query's prompt length
    (from its trace) and the generation's round records in order, the input of ``fit_overheads``."""
    live = Path(live)
    if not (live / ROUNDS).is_file():
        raise SpecbenchError(
            f"replay.live={live}: no {ROUNDS} there", "point replay.live at a `specbench eval` run directory"
        )
    prompt = {r["query_id"]: int(r["trace"]["prompt_len"]) for r in rows}
    gens: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in read_jsonl(live / ROUNDS):
        if r.get("query_id") in prompt and (ids is None or r["query_id"] in ids):
            gens[(r["query_id"], r["method"])].append(r)
    if not gens:
        raise SpecbenchError(
            f"replay.live={live}: no generation of a query of the trace",
            "evaluate the traced queries (the same dataset and limit) into the live run",
        )
    return [(prompt[q], sorted(rs, key=lambda r: r["round"])) for (q, _), rs in gens.items()]


def fit_from_live(costs: Costs, live, rows: list[dict], ids=None) -> dict[str, tuple[float, int]]:
    """The replay clock's per-round overheads (``fit_overheads``) fitted on the live run's rounds."""
    return fit_overheads(costs, live_queries(live, rows, ids))


def overheads_text(fitted: dict[str, tuple[float, int]]) -> str:
    return ", ".join(
        f"{k} {fitted[k][0] * 1e3:+.2f} ms ({fitted[k][1]:,} rounds)"
        for k in (*ROUND_KINDS, SWITCH)
        if k in fitted
    )


def replay_all(out: Path, rows: list[dict], methods: list[Method], arms: list[str], seeds: int, clock: tuple):
    """Every method over every traced query (a seeded method once per seed; fixed arms first, as they define each
    query's best drafter among those the selectors play), written as it goes (``examples`` and ``rounds`` of seed 0, ``seeds`` of every seed);
    ``(per-seed rows, convergence cells, rounds replayed)``. ``clock``: ``(limits, costs, draft lengths)``."""
    limits, costs, lengths = clock
    queries = [
        (r, QueryTrace.from_dict(r["trace"]), SimpleNamespace(id=r["query_id"], task=r["task"])) for r in rows
    ]
    per_seed: list[dict] = []
    convergence: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    best: dict[str, str] = {}
    n_rounds = 0
    runs = {
        m.name: seeds if m.seeded else 1 for m in methods
    }  # seeded instantiates a selector: once per method
    order = sorted(methods, key=lambda m: not (m.name == AUTOREGRESSIVE or m.name.startswith("fixed:")))
    with (
        JsonlWriter(out / EXAMPLES) as ex_w,
        JsonlWriter(out / ROUNDS) as rd_w,
        JsonlWriter(out / SEEDS) as sd_w,
        tqdm(total=sum(runs.values()) * len(queries), desc="replay", unit="query") as bar,
    ):
        for m in order:
            if m.name != AUTOREGRESSIVE and not m.name.startswith("fixed:") and not best:
                best = best_arms(per_seed, playable(methods))
            for seed in range(runs[m.name]):
                selector = m.reseeded(arms, seed)
                for row, qt, query in queries:
                    gen = replay(qt, selector, limits, costs, lengths, query)
                    n_rounds += len(gen.rounds)
                    top = best.get(row["query_id"])
                    rec = summary_row(m.name, seed, row, gen, top, selector.fixed_members)
                    per_seed.append(rec)
                    sd_w.write(rec)
                    for rnd in gen.rounds if top else []:
                        cell = convergence[m.name][rnd.index]
                        cell[0] += on_arm(rnd, top, selector.fixed_members)
                        cell[1] += 1
                    if seed == 0:
                        rd_w.write_many(
                            {**round_row(row["query_id"], row["task"], m.name, r), "replayed": True}
                            for r in gen.rounds
                        )
                        ex_w.write(example_row(m.name, row, gen))
                    bar.update(1)
    return per_seed, convergence, n_rounds


def refuse_context_aware(specs: list[str], cfg: DictConfig) -> None:
    """A selector that reads the query's embedding (the offline policy) cannot replay: traces hold no embedding."""
    for spec in specs:
        scfg = (
            cfg.get("selector")
            if spec == "selector"
            else load_selector_config(spec.split(":", 1)[1], cfg)
            if spec.startswith("selector:")
            else None
        )
        if scfg is not None and context_aware(scfg.get("_target_")):
            raise SpecbenchError(
                f"method '{spec}' is a context-aware policy: it reads the query's embedding from the "
                "target, which a trace does not record",
                "evaluate the policy live (specbench eval selector=policy ...) and replay the others",
            )


def costs_of(cfg: DictConfig, traced: dict) -> Costs:
    """The replay clock: the trace's own cost curves, or with ``profile_path`` a `specbench profile` run's verification
    curve (the catch-up curves always come from the trace)."""
    if cfg.get("profile_path"):
        prof = profiling.load_profile(cfg.profile_path)
        for key in ("dtype", "threads"):
            if key in prof and key in traced and prof[key] != traced[key]:
                raise SpecbenchError(
                    f"profile_path was measured with {key} {prof[key]}, the trace with {traced[key]}",
                    "profile in the trace's dtype and threads, or leave profile_path unset",
                )
        return Costs.from_dict(prof, traced.get("catch_up") or {}, traced.get("tree_extra_s") or 0.0)
    return Costs.from_dict(traced)


def draft_lengths(cfg: DictConfig, first: dict) -> dict[str, int]:
    """Each drafter's draft length in the replay: its own (from its config), else ``decoding.draft_length`` (null:
    the trace run's); refused beyond what the trace holds."""
    run_length = int(cfg.replay.draft_length or first["draft_length"])
    out = {}
    for name, traced in first["lengths"].items():
        k = int(first["own_lengths"].get(name) or run_length)
        if k > int(traced):
            raise SpecbenchError(
                f"drafter '{name}' would draft {k} tokens a round; the trace holds {traced}",
                f"replay with replay.draft_length <= {traced}, or trace with trace.draft_length={k}",
            )
        out[name] = k
    return out


def on_arm(rnd, arm: str, fixed: tuple[str, ...] = ()) -> int:
    """Whether the round chose ``arm``: played it, or chose it into its tree (``fixed``: the members every round's tree
    holds by construction, which count as no choice)."""
    if rnd.members is not None:
        return int(arm in rnd.members and arm not in fixed)
    return int(rnd.arm == arm)


def summary_row(
    method: str, seed: int, row: dict, gen, best: str | None, fixed: tuple[str, ...] = ()
) -> dict:
    rounds = gen.rounds
    late = [r for r in rounds if r.index >= LATE]
    early = rounds[:LATE]

    def share(rs) -> float | None:
        return sum(on_arm(r, best, fixed) for r in rs) / len(rs) if best and rs else None

    return {
        "method": method,
        "seed": seed,
        "query_id": row["query_id"],
        "task": row["task"],
        "new_tokens": len(gen.tokens),
        "seconds": gen.seconds,
        "rounds": len(rounds),
        "accepted": gen.accepted,
        "drafted": gen.drafted,
        "switches": gen.switches,
        "best_arm": best,
        "best_share": share(rounds),
        "best_share_early": share(early),
        "best_share_late": share(late),
        "counterfactual": getattr(gen, "counterfactual", 0),
        "bd": statistics.fmean(r.bd for r in rounds) if rounds else 0.0,
        "be": statistics.fmean(r.be for r in rounds) if rounds else 0.0,
    }


def example_row(method: str, row: dict, gen) -> dict:
    """An ``examples.jsonl`` line in eval's fields (predicted seconds; quality copied when the output is the trace's)."""
    same = list(gen.tokens) == list(row["output_ids"])
    return {
        "query_id": row["query_id"],
        "task": row["task"],
        "method": method,
        "output_ids": list(gen.tokens),
        "text": row["text"] if same else "",
        "new_tokens": len(gen.tokens),
        "seconds": gen.seconds,
        "target_calls": gen.target_calls,
        "rounds": len(gen.rounds),
        "drafted": gen.drafted,
        "accepted": gen.accepted,
        "switches": gen.switches,
        "t_switch": sum(r.t_switch for r in gen.rounds),
        "stop": gen.stop,
        "t_select": 0.0,
        "category": row.get("category"),
        "turn": 1,
        "reference": row.get("reference"),
        "quality": row.get("quality", {}) if same else {},
        "deferred": 0,
        "query_sha": row.get("query_sha"),
        "drafters": row.get("drafters"),
        "process": "replay",
        "replayed": True,
    }


def best_arms(per_seed: list[dict], among: set[str] | None = None) -> dict[str, str]:
    """Per query, the drafter (not the autoregressive arm) whose fixed replay is fastest: the per-query oracle; with
    ``among``, the fastest of those drafters (the ones the run's selectors play: :func:`playable`)."""
    out: dict[str, tuple[float, str]] = {}
    for r in per_seed:
        arm = r["method"].split(":", 1)[1] if r["method"].startswith("fixed:") else None
        if arm is not None and (among is None or arm in among) and r["new_tokens"]:
            spt = r["seconds"] / r["new_tokens"]
            if r["query_id"] not in out or spt < out[r["query_id"]][0]:
                out[r["query_id"]] = (spt, arm)
    return {q: arm for q, (_, arm) in out.items()}


def playable(methods: list[Method]) -> set[str] | None:
    """The drafters the run's selectors choose among, when every selector names its candidates (a trace's reference
    rows, which no selector plays, are then no query's best drafter); None when any plays the whole pool."""
    chosen = [m.config.get("candidates") for m in methods if m.config is not None]
    if not chosen or any(c is None for c in chosen):
        return None
    return {str(a) for c in chosen for a in c}


def method_table(per_seed: list[dict]) -> pd.DataFrame:
    """Per method over seeds and queries (seconds per token averaged over seeds per query first)."""
    df = pd.DataFrame(per_seed)
    df["spt"] = df.seconds / df.new_tokens.clip(lower=1)
    q = (
        df.groupby(["method", "query_id"])
        .agg(spt=("spt", "mean"), seconds=("seconds", "mean"), new_tokens=("new_tokens", "mean"))
        .reset_index()
    )
    ar = q[q.method == AUTOREGRESSIVE].set_index("query_id")
    fixed = q[q.method.str.startswith("fixed:")]
    per_query_oracle = fixed.groupby("query_id").spt.min()
    round_oracle = q[q.method == ORACLE_ROUND].set_index("query_id").spt
    rows = []
    for method, sub in df.groupby("method", sort=False):
        mq = q[q.method == method].set_index("query_id")
        speed = ar.seconds.reindex(mq.index).sum() / mq.seconds.sum() if not ar.empty else float("nan")
        by_seed = sub.groupby("seed").apply(
            lambda s: (
                (ar.seconds.reindex(s.query_id).sum() / s.seconds.sum()) if not ar.empty else float("nan")
            ),
            include_groups=False,
        )
        rows.append(
            {
                "method": method,
                "queries": mq.shape[0],
                "seeds": sub.seed.nunique(),
                "speedup": speed,
                "speedup_sd_seeds": float(by_seed.std()) if len(by_seed) > 1 else 0.0,
                "vs_query_oracle": float((per_query_oracle.reindex(mq.index) / mq.spt).mean())
                if len(per_query_oracle)
                else float("nan"),
                "vs_round_oracle": float((round_oracle.reindex(mq.index) / mq.spt).mean())
                if len(round_oracle)
                else float("nan"),
                "best_share": sub.best_share.mean(),
                "best_share_late": sub.best_share_late.mean(),
                "switches": sub.switches.mean(),
                "rounds": sub.rounds.mean(),
                "counterfactual": sub.counterfactual.sum() / max(sub.rounds.sum(), 1),
                "accepted_per_round": sub.accepted.sum() / max(sub.rounds.sum(), 1),
            }
        )
    return pd.DataFrame(rows)


def fitted_note(fitted, cfg: DictConfig) -> str:
    """What the clock charges a round beyond its forward, and where that came from."""
    if fitted:
        return (
            f" A verification is charged its kind of round's mean overhead beyond the cost curve, fitted on the live "
            f"run {cfg.replay.live}: {overheads_text(fitted)}."
        )
    return (
        " No live run was given (replay.live): a tree round is charged the trace's measured tree_extra beyond a "
        "chain forward, a chain round nothing beyond its forward (live rounds also pay their probabilities, "
        "acceptance and cache commit)."
    )


def approximate_note(rows) -> str:
    """The traced drafters whose rewards replay approximately (not history-free: e.g. dynamic int8), named."""
    names = sorted(
        {
            name
            for r in rows
            for name, d in (r["trace"].get("drafters") or {}).items()
            if isinstance(d, dict) and d.get("history_free") is False
        }
    )
    if not names:
        return ""
    return (
        f" Approximate: {', '.join(names)} (not history-free: a catch-up over many tokens computes other "
        "probabilities than one token at a time, so their drafts, acceptances and Block Divergence replay only "
        "approximately)."
    )


def write_outputs(
    out: Path, per_seed, convergence, rows, n_rounds: int, elapsed: float, cfg: DictConfig, fitted=None
) -> None:
    table = method_table(per_seed)
    tables.write_csv(table, out / SEEDS_CSV)
    positions = sum(len(r["output_ids"]) for r in rows)
    note = (
        f"Replayed over {len(rows)} traced queries ({positions:,} positions) from {cfg.traces}: {n_rounds:,} rounds in "
        f"{elapsed:.1f} s ({n_rounds / max(elapsed, 1e-9):,.0f} rounds/s). Times are predicted by the trace's cost "
        "curves. vs_query_oracle: mean over queries of (the query's fastest fixed drafter's seconds per token / the "
        "method's); vs_round_oracle: the same against oracle:round. best_share: share of rounds that chose the "
        "query's fastest drafter among those the selectors play (tree rounds: chose it into the tree; members every tree holds by construction "
        f"count as no choice); _late: rounds from index {LATE} on. counterfactual: side observations a round given "
        "as the observer's own draft's Block Divergence, because the trace did not hold the live one "
        "(trace.side_observations off, or a draft cut shorter than traced): such runs replay with better "
        "information than live." + approximate_note(rows) + fitted_note(fitted, cfg)
    )
    atomic_write_text(
        out / "seeds.md", f"# specbench replay (every seed)\n\n{note}\n\n{tables.to_markdown(table)}\n"
    )
    conv = pd.DataFrame(
        [
            {"method": m, "round": r, "share": hit / n, "n": n}
            for m, cells in convergence.items()
            for r, (hit, n) in sorted(cells.items())
        ]
    )
    if not conv.empty:
        tables.write_csv(conv, out / CONVERGENCE_CSV)
    examples = list(read_jsonl(out / EXAMPLES))
    summary = tables.summarize(examples)
    tables.write_tables(
        summary, out, title="specbench replay (seed 0; predicted times)", notes=tables.EVAL_NOTES
    )
    tables.print_table(
        tables.to_markdown(table), title=f"replay ({out}; every column in seeds.csv / seeds.md)"
    )
    print(note)
