"""The replay's calibration against a live run of the same queries (``long_horizon --live``): each live method
replayed over the traces with the same seeds and limits, its round overheads cross-fitted on the other half of the
queries, then predicted against measured seconds per token per method, the same over the rounds before each
generation's first fork (where both decode the traced text: the clock alone differs), the bf16 forks, and whether the
live run ranks the adaptive methods as the replay does. The spread of the before-fork factors is the clock's error
on a replayed speed ratio (``clock_error``), which ``long_horizon`` applies to every replayed speed verdict."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbench.arms import AUTOREGRESSIVE
from specbench.configs import conf_dir
from specbench.decoding import certify
from specbench.decoding.loop import Limits
from specbench.decoding.replay import replay
from specbench.decoding.replay_costs import Costs, fit_overheads
from specbench.decoding.trace import QueryTrace
from specbench.errors import SpecbenchError
from specbench.pipelines import replay as replay_pipeline
from specbench.pipelines.methods import parse_methods
from specbench.pipelines.tables import to_markdown
from specbench.pipelines.trace import load_traces
from specbench.records import read_jsonl
from specbench.reproduction.runs import CONFIG, EXAMPLES, ROUNDS

FLAG = 0.10  # a method whose predicted seconds per token are off the live ones by more than this is named
# the calibration column of replay / live seconds over the rounds before each generation's first fork
PREFIX = "rounds before fork: replay / live"
SWITCHING = "switching before fork: replay / live"  # the drafters' catch-up seconds of those rounds
# the leading rounds that equal the replay's (arm, drafted, accepted): there the clock alone differs
EQUAL = "equal rounds: replay / live"


def compose_replay(overrides: list[str]):
    """The replay config (``conf/replay.yaml``) with ``overrides``."""
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        return compose(config_name="replay", overrides=overrides)


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
