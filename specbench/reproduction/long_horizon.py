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
page carries the calibration of the replay against a live run of the same queries (``replay_calibration.py``):
predicted against measured seconds per token per method (off by more than 10%: named), the same over the rounds
before each generation's first fork only (where both decode the traced text: the clock alone, whose spread across
methods is the clock's error), the bf16 fork rate (live outputs that leave the traced, autoregressive one) and
whether the live run ranks the bandits as the replay does.

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

from specbench.decoding.replay_costs import Costs
from specbench.decoding.trace import QueryTrace
from specbench.errors import SpecbenchError, exit_on
from specbench.files import atomic_write_text, existing
from specbench.pipelines import replay as replay_pipeline
from specbench.pipelines.tables import to_markdown
from specbench.pipelines.trace import load_traces
from specbench.reproduction import intervals as CI
from specbench.reproduction import verdicts as V
from specbench.reproduction.replay_calibration import (
    calibration,
    calibration_section,
    clock_error,
    compose_replay,
)
from specbench.reproduction.replay_verdicts import (
    IN_ROUNDS,
    REPLAYED,
    ROUNDS_AXIS,
    best_single,
    convergence_table,
    labelled,
    on_the_clock,
    per_query,
    plot_convergence,
    regret_table,
    seed_pool_cause,
    segment_bests,
    share_verdict,
    speed_verdict,
    task_oracle,
    variance_table,
)
from specbench.reproduction.runs import SEEDS

CONVERGENCE = ["ucb-bd", "ucb-be", "exp3-bd", "halving-bd", "hedge-bd"]
# the changing stream: each task's queries one after another (segments of thousands of rounds), the model drafters
# as the only arms
# their names there; their memories are sized by Garivier-Moulines' rule (``garivier_moulines``) before the replay
DUCB_SEGMENT, SWUCB_SEGMENT = "ducb-gm-bd", "swucb-gm-bd"
# full information: replayed only over a trace that holds the side observations (else refused: counterfactual)
FULL_INFORMATION = ["selector:hedge"]
BANDITS = [
    "autoregressive",
    "fixed:*",
    "oracle:round",
    "selector:ucb",
    "selector:ucb_be",
    "selector:random",
    "selector:exp3",
    "selector:sequential_halving",
    "selector:explore_commit",
    "selector:router",
    "selector:tree_ucb",
]


KEY = "metasd/long_horizon"  # the exhibit's key: its parts are <KEY>#<name>
# every verdict's fields (the reproduction report reads them back: load_verdicts)
VERDICTS_DATA = "verdicts_data.json"
MEMORIES = "memories.json"  # the changing stream's D-UCB / SW-UCB memories and the rule's inputs
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
        f"{CI.INTERVAL_TEXT}. The full page "
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
            *([f"selector.candidates=[{','.join(arms)}]"] if arms else []),  # the run's own selector, too
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
    dirs = {}

    def replay(name: str, overrides: list[str]) -> None:
        d = out / name
        replay_pipeline.run(
            compose_replay([f"traces={trace_run}", f"seeds={seeds}", "overwrite=true", *clock, *overrides]), d
        )
        dirs[name] = d

    for name, overrides in runs.items():
        replay(name, overrides)
    if len(models) > 1:  # its memories are fixed from the bandits replay before it runs
        memories = changing_memories(dirs["bandits"], models, len({r["task"] for r in rows}))
        atomic_write_text(out / MEMORIES, json.dumps(memories, indent=1))
        for name, overrides in changing_runs(models, memories).items():
            replay(name, overrides)
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


def garivier_moulines(horizon: float, breakpoints: int) -> tuple[float, int]:
    """The memories Garivier and Moulines (2011) size for a horizon of ``horizon`` rounds with ``breakpoints``
    changes of the best arm: discounted UCB's gamma = 1 - sqrt(breakpoints / horizon) / 4 and sliding-window UCB's
    window = 2 sqrt(horizon log(horizon) / breakpoints) rounds (their Theorems 1 and 2's tuning)."""
    b = max(int(breakpoints), 1)
    t = max(float(horizon), 2.0)
    return 1 - math.sqrt(b / t) / 4, max(int(round(2 * math.sqrt(t * math.log(t) / b))), 1)


def changing_memories(bandits: Path, arms: list[str], tasks: int) -> dict:
    """The changing stream's memories, fixed before its replay by a stated rule (:func:`garivier_moulines`): the
    horizon is the rounds the stream takes, averaged over the fixed arms (from the bandits replay, run first), and
    the breakpoints are the task boundaries of the by-task order (tasks - 1)."""
    q = per_query(bandits / SEEDS)
    fixed = q[q.method.isin([f"fixed:{a}" for a in arms])]
    horizon = float(fixed.groupby("method").rounds.sum().mean())
    gamma, window = garivier_moulines(horizon, tasks - 1)
    return {"horizon": horizon, "breakpoints": tasks - 1, "gamma": gamma, "window": window}


def changing_runs(arms: list[str], memories: dict) -> dict[str, list[str]]:
    """The changing stream's replay (task by task, statistics carried, the model drafters as the only arms): UCB,
    explore-then-commit, discounted UCB and sliding-window UCB with the memories of :func:`changing_memories`
    (their own overrides: ``selector_overrides.<option>``)."""
    fixed = ",".join(["autoregressive", *(f"fixed:{a}" for a in arms)])
    selectors = "selector:ucb,selector:explore_commit,selector:discounted_ucb,selector:sliding_window_ucb"
    return {
        "changing": [
            f"methods=[{fixed},{selectors}]",
            "replay.order=by_task",
            "+selector_overrides.carry_over=true",
            f"+selector_overrides.candidates=[{','.join(arms)}]",
            f"+selector_overrides.discounted_ucb.gamma={memories['gamma']}",
            f"+selector_overrides.discounted_ucb.name={DUCB_SEGMENT}",
            f"+selector_overrides.sliding_window_ucb.window={memories['window']}",
            f"+selector_overrides.sliding_window_ucb.name={SWUCB_SEGMENT}",
        ],
    }


# -- per-query columns --------------------------------------------------------------------------------


# -- exhibits -----------------------------------------------------------------------------------------


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
            "## Reward variance and discrimination: Block Divergence against Block Efficiency (fixed arms)",
            *variance_table(dirs["bandits"], arms),
            DISCRIMINATION_NOTE,
        ),
        verdict_section(  # UCB-BD against the best single drafter is judged in the seed's-pool section below
            "## Regret against the per-query and per-round oracles", regret_table(q, arms)[0], [], REGRET_NOTE
        ),
        diagonal_section(q, arms),
        switching_section(dirs["switching"], switch_cost),
        stream_section(dirs["stream"]),
        *(
            [seed_pool_section(dirs["seed_pool"]), changing_section(dirs["changing"], out / MEMORIES)]
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
    atomic_write_text(out / SOURCE, json.dumps(source(trace_run, rows, arms, live), indent=1))
    from specbench import provenance

    provenance.record(
        out
    )  # the code that replayed and judged (the trace and the live check record their own)
    print(text)
    return out / "long_horizon.md"


REGRET_NOTE = (
    "Ratios are total seconds per token of the oracle over the method's on the same queries (1: as fast as the "
    "oracle). The per-round oracle picks, each round in hindsight, the arm with the most tokens per second of that "
    "round (catch-up included); greedy round by round, it can trail the per-query oracle when switching costs."
)


def source(trace_run: Path, rows: list[dict], arms: list[str] | None, live: Path | None = None) -> dict:
    """What the replays ran over: the trace run, its queries per task, its token limit, the selectors' arms and the
    live check's run (the report reads both runs' provenance from here)."""
    return {
        "trace": str(trace_run),
        "live": str(live) if live is not None else None,
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
        f"and shares averaged over seeds first) with 95% {CI.INTERVAL_TEXT}s.",
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
        "## Convergence: share of rounds on each query's fastest drafter (of those the selectors play), by round index",
        "",
        to_markdown(conv[conv.method.isin(CONVERGENCE + ["router", "tree_ucb-bd", "etc-bd"])]),
        "",
    ]
    if plot_convergence(run, out / "convergence.png", CONVERGENCE):
        lines += ["![convergence](convergence.png)", ""]
    early = "UCB-BD plays the best drafter more often than {} in the first 100 rounds"
    verdicts = [
        V.keyed(share_verdict(q, early.format("UCB-BE"), "ucb-bd", "ucb-be", "early"), f"{KEY}#bd-early"),
        V.keyed(share_verdict(q, early.format("EXP3"), "ucb-bd", "exp3-bd", "early"), f"{KEY}#early-vs-exp3"),
        V.keyed(
            share_verdict(q, early.format("sequential halving"), "ucb-bd", "halving-bd", "early"),
            f"{KEY}#early-vs-halving",
        ),
        V.keyed(
            share_verdict(
                q,
                "UCB-BD plays the best drafter more often than UCB-BE from round 100 on",
                "ucb-bd",
                "ucb-be",
                "late",
            ),
            f"{KEY}#bd-late",
        ),
        V.keyed(
            speed_verdict(
                q,
                f"UCB-BD is faster than the static uniform mixture (a uniformly random drafter every round), {IN_ROUNDS}",
                "ucb-bd",
                "random",
                cost=ROUNDS_AXIS,
            ),
            f"{KEY}#uniform",
        ),
    ]
    return lines + ["### Verdicts", ""] + [f"- {v.line()}" for v in verdicts] + [""], verdicts


def switching_section(run: Path, switch_cost: float) -> tuple[list[str], list[V.Verdict]]:
    """Explore-then-commit and the measured switching penalty against UCB-BD when switches cost their catch-up."""
    qs = per_query(run / SEEDS)
    sw = regret_table(qs)[0]
    verdicts = [
        V.keyed(
            labelled(
                fewer_switches(qs, "Explore-then-commit switches drafters less often than UCB-BD", "etc-bd")
            ),
            f"{KEY}#etc-fewer",
        ),
        V.keyed(
            speed_verdict(
                qs,
                "Explore-then-commit is faster than UCB-BD when switches cost their catch-up",
                "etc-bd",
                "ucb-bd",
            ),
            f"{KEY}#etc-faster",
        ),
        V.keyed(
            speed_verdict(
                qs,
                "UCB with the measured switching penalty is faster than plain UCB-BD",
                "ucb-switch-measured",
                "ucb-bd",
            ),
            f"{KEY}#penalty-faster",
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
    title = (
        "## Non-stationarity: the interleaved stream as one sequence (statistics carried; the task changes at "
        "every query)"
    )
    note = (
        "Shown, not judged: the seed proposes discounted and sliding-window UCB for a best drafter that changes "
        "between long stretches; where it changes at every query no memory can follow it (the changing stream below "
        "is their design's test)."
    )
    return verdict_section(title, st[~st.method.str.startswith("fixed:")], [], note)


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
        V.keyed(speed_verdict(q, claim.format(""), "ucb-bd", best, cost=ROUNDS_AXIS), f"{KEY}#beats-best"),
        V.keyed(
            speed_verdict(
                q, claim.format(" carried across the stream"), "ucb-bd-carry", best, cost=ROUNDS_AXIS
            ),
            f"{KEY}#beats-best-carried",
        ),
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


def changing_section(run: Path, memories_file: Path) -> tuple[list[str], list[V.Verdict]]:
    """Discounted and sliding-window UCB (memories sized by Garivier-Moulines' rule, fixed before the replay) against
    UCB on the changing stream, as designed: each task's queries one after another, statistics carried, the model
    drafters only; each plays each query's best drafter on more of its rounds than UCB."""
    q = per_query(run / SEEDS)
    memories = json.loads(memories_file.read_text(encoding="utf-8")) if memories_file.is_file() else {}
    ducb, swucb = DUCB_SEGMENT, SWUCB_SEGMENT
    share = "{} plays each query's best model drafter on more of its rounds than UCB on the changing stream"
    verdicts = [
        V.keyed(
            share_verdict(q, share.format("Discounted UCB"), ducb, "ucb-bd", "best_share"),
            f"{KEY}#changing-ducb",
        ),
        V.keyed(
            share_verdict(q, share.format("Sliding-window UCB"), swucb, "ucb-bd", "best_share"),
            f"{KEY}#changing-swucb",
        ),
    ]
    title = "## Non-stationarity: a stream whose best drafter changes (task segments, model drafters only)"
    rule = (
        f"Garivier-Moulines' rule for a horizon of {memories.get('horizon', math.nan):,.0f} rounds (the stream's rounds, "
        f"averaged over the fixed arms) and {memories.get('breakpoints')} breakpoints (the task boundaries): discounted "
        f"UCB's gamma {memories.get('gamma', math.nan):.5f} (1 - sqrt(B/T)/4) and sliding-window UCB's window "
        f"{memories.get('window')} rounds (2 sqrt(T log T / B)), fixed before this replay ran"
        if memories
        else "memories not recorded"
    )
    note = (
        "Each task's traced queries one after another, every selector's statistics carried across them, the model "
        "drafters the only arms. Each segment's best drafter (the fixed drafter with the fewest target rounds per "
        "token over the segment's queries): "
        + segment_bests(q)
        + f". Memories: {rule}. The seed proposes these methods for such a stream without claiming a result, so the "
        "verdicts check that they behave as designed (they follow the change); their speed is in the table."
    )
    st = regret_table(q)[0]
    return verdict_section(title, st, verdicts, note)


def fewer_switches(q: pd.DataFrame, claim: str, a: str, b: str = "ucb-bd") -> V.Verdict:
    """``a`` switches drafters fewer times per query than ``b`` (seed-averaged, paired per query)."""
    pa = q[q.method == a].set_index("query_id").switches
    pb = q[q.method == b].set_index("query_id").switches
    ids = sorted(set(pa.index) & set(pb.index), key=str)
    return V.greater_mean(
        claim, list(pb.reindex(ids)), list(pa.reindex(ids)), f"switches per query, {b} - {a}"
    )


DISCRIMINATION_NOTE = (
    "Discrimination: per query, each reward's gap between the best and the second-best drafter (by their mean reward "
    "over the query's drafting rounds) over the pooled standard deviation of the two drafters' rounds; the claim "
    "compares the two rewards' gaps on the same queries."
)


def diagonal_section(q: pd.DataFrame, arms: list[str] | None) -> tuple[list[str], list[V.Verdict]]:
    """The specialists' acceptance off their task, replayed: on each task, its own specialist needs fewer target
    rounds per token than every other specialist, paired per query."""
    from specbench.reproduction.exhibit import SPECIALISTS

    own = {d: t for d, t in SPECIALISTS.items() if arms is None or d in arms}
    present = set(q.method)
    parts = []
    for d, task in own.items():
        sub = q[q.task == task]
        for o in own:
            if o == d or f"fixed:{o}" not in present or f"fixed:{d}" not in present:
                continue
            parts.append(
                (
                    f"{task}: {d} vs {o}",
                    speed_verdict(sub, "", f"fixed:{d}", f"fixed:{o}", cost=ROUNDS_AXIS),
                )
            )
    if not parts:
        return [], []
    v = V.keyed(
        labelled(
            V.all_of(
                "each specialist needs fewer target rounds per token on its own task than every other specialist",
                parts,
                "each part: tokens per target round ratio specialist / other > 1",
            )
        ),
        f"{KEY}#diagonal",
    )
    table = pd.DataFrame(
        [
            {"task": t, **{d: float(r.new_tokens.sum() / r.rounds.sum()) for d, r in q[q.task == t].groupby("method")
                           if d.removeprefix("fixed:") in own}}
            for t in dict.fromkeys(q.task)
        ]
    )  # fmt: skip
    return verdict_section(
        "## The specialists off their task: tokens per target round by task (fixed arms)", table, [v]
    )


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
        existing(
            a.trace_run,
            "the trace run",
            "run its `specbench trace` first (make trace-seed), or pass its directory",
        )
        existing(a.live, "the live run", "run the live check first (make trace-seed runs it), or drop --live")
        write(Path(a.trace_run), Path(a.out), a.seeds, Path(a.live) if a.live else None, arms)
    except SpecbenchError as exc:
        exit_on(exc)


if __name__ == "__main__":
    main()
