"""Does a multi-drafter method beat the best single drafter? The table of one eval run, with paired intervals.

Read from a run directory (``examples.jsonl``, ``rounds.jsonl``), nothing re-timed:
- the single drafters (``fixed:<d>``): each one's speedup over autoregressive decoding on the same queries;
  the best of them over the whole run is *the best single drafter*;
- the per-task oracle (the best single drafter of each task, picked in hindsight on the same queries) and the
  per-query oracle (the fastest single drafter of each query: in hindsight, or cross-fitted when every single
  drafter has an A/A repeat, ``again:fixed:*`` in methods: chosen on the first runs, its seconds the repeat's);
- every other method (trees, the router, bandits): its speedup, MAT, and its speed ratio to the best single
  drafter and to the per-task oracle, each with a paired 95% interval over queries
  (``reproduction.verdicts``); the claims "at least 1.15x the best single drafter" and "at least the
  per-task oracle" are judged on them;
- for a ``tree:*`` method (the whole pool in every round's tree): the per-round oracle's acceptance, the
  mean tokens per round when each round keeps the best drafter's draft (its time needs a replay with the
  cost profile: not estimated here);
- each drafter with a dynamic tree against the same drafter drafting a chain (two pool entries whose configs differ
  only in ``tree`` and ``draft_length``, both run as ``fixed:``): tokens a round and the paired speed ratio.

    python -m specbench.reproduction.multi_drafter outputs/trees_cpu     (make trees-cpu)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.arms import AUTOREGRESSIVE
from specbench.errors import SpecbenchError, exit_on
from specbench.files import atomic_write_text, existing
from specbench.pipelines.tables import print_table, to_markdown
from specbench.pipelines.tables import with_oracle as with_task_oracle
from specbench.reproduction import compare
from specbench.reproduction import intervals as CI
from specbench.reproduction import verdicts as V
from specbench.reproduction.exhibit import Exhibit, ExhibitSpec
from specbench.reproduction.inputs import NotRun, load_examples, load_round_values
from specbench.reproduction.runs import CONFIG, EXAMPLES, METASD_TREES

TASK_ORACLE = "oracle"  # pipelines.tables.with_oracle's method name: the best fixed drafter per task
QUERY_ORACLE = compare.ORACLE
BEST_SINGLE_MARGIN = 1.15  # issue 31's goal for the best tree or router method


def speed(ex: pd.DataFrame, method: str) -> tuple[float, int]:
    """Speedup of ``method`` over autoregressive decoding on the queries both ran (ratio of total seconds per
    token), and that query count."""
    p = compare.paired(ex, [method, AUTOREGRESSIVE])
    if not len(p[method]):
        return float("nan"), 0
    (ms, mt), (bs, bt) = (compare.timed(p[x]) for x in (method, AUTOREGRESSIVE))
    ratio = CI.seconds_per_token(np.asarray(bs), np.asarray(bt)) / CI.seconds_per_token(
        np.asarray(ms), np.asarray(mt)
    )
    return float(ratio), len(p[method])


def tables_of(
    run_dir: Path, arms: list[str] | None = None, margin: float = BEST_SINGLE_MARGIN
) -> tuple[pd.DataFrame, list[V.Verdict], dict]:
    """The table, the verdicts and facts of one run. ``arms``: the drafters that count as single drafters (the best
    single drafter and the oracles are chosen among them; the other ``fixed:`` rows are reference rows only), None:
    every ``fixed:`` row. ``margin``: the multiple of the best single drafter each other method is judged against."""
    run_dir = Path(run_dir)
    ex, methods, singles, reference = run_methods(run_dir, arms)
    speeds = {m: speed(ex, m) for m in [*methods, TASK_ORACLE, QUERY_ORACLE] if m in set(ex.method)}
    best = max(singles, key=lambda m: speeds[m][0])
    rounds = load_round_values(
        run_dir.parent,
        run_dir.name,
        None,
        ("query_id", "method", "emitted", "accepted", "members", "member_accepted"),
    )
    mat = rounds.groupby("method").emitted.mean() if len(rounds) else pd.Series(dtype=float)
    multi = [m for m in methods if m != AUTOREGRESSIVE and not m.startswith("fixed:")]
    rows, verdicts = [], []
    for m in [AUTOREGRESSIVE, *singles, *reference, TASK_ORACLE, QUERY_ORACLE, *multi]:
        if m not in speeds:
            continue
        s, n = speeds[m]
        row = {
            "method": m,
            "n": n,
            "speedup": s,
            "mat": float(mat.get(m, float("nan"))),
            "vs best single": s / speeds[best][0],
            "95% CI (best single)": "",
            "vs per-task oracle": s / speeds[TASK_ORACLE][0],
            "95% CI (oracle)": "",
        }
        if m in multi:
            vb, vo = judged_against(ex, m, best, margin)
            verdicts += [vb, vo]
            row["95% CI (best single)"] = _ci(vb)
            row["95% CI (oracle)"] = _ci(vo)
        rows.append(row)
    facts = {"best_single": best, "per_round_oracle_mat": _per_round_oracle(rounds), "reference": reference}
    return pd.DataFrame(rows), verdicts, facts


def run_methods(run_dir: Path, arms: list[str] | None):
    """``(examples with both oracles, methods, single drafters, reference rows)`` of an eval run, refused without an
    autoregressive baseline or without the single drafters asked for."""
    ex = load_examples(run_dir.parent, run_dir.name)
    if ex.empty:
        raise SpecbenchError(f"{run_dir}: no {EXAMPLES} records", "point at a `specbench eval` run directory")
    methods = list(dict.fromkeys(ex.method))
    if AUTOREGRESSIVE not in methods:
        raise SpecbenchError(
            f"{run_dir}: the run has no autoregressive baseline", "run eval with it in methods"
        )
    fixed = [m for m in methods if m.startswith("fixed:")]
    singles = fixed if arms is None else [f"fixed:{a}" for a in arms]
    missing = [m for m in singles if m not in fixed]
    if not singles or missing:
        raise SpecbenchError(
            f"{run_dir}: no single drafter run as {', '.join(missing) or 'fixed:<d>'}",
            "add fixed:* to methods, or name drafters whose fixed: rows the run holds",
        )
    reference = [
        m for m in fixed if m not in singles
    ]  # shown, never the best single drafter nor in an oracle
    ex = pd.concat(
        [with_task_oracle(ex[~ex.method.isin(reference)]), ex[ex.method.isin(reference)]], ignore_index=True
    )
    return compare.with_oracle(ex, singles), methods, singles, reference


def judged_against(ex: pd.DataFrame, m: str, best: str, margin: float) -> tuple[V.Verdict, V.Verdict]:
    """``m`` against ``margin`` times the best single drafter, and against the per-task oracle, paired per query."""
    vb = compare.faster_on(
        ex,
        f"{m} is at least {margin:g}x the best single drafter ({best})",
        m,
        best,
        threshold=margin,
        at_least=True,
    )
    vo = compare.faster_on(
        ex, f"{m} is at least as fast as the per-task oracle", m, TASK_ORACLE, threshold=1.0, at_least=True
    )
    return vb, vo


def _ci(v: V.Verdict) -> str:
    return f"[{v.interval[0]:.3f}, {v.interval[1]:.3f}]" if v.interval else "n/a"


def _per_round_oracle(rounds: pd.DataFrame) -> dict[str, float] | None:
    """From a ``tree:*`` run: tokens per round if each round kept its best single drafter's draft (the tree's own
    accepted length, + 1), against each drafter's own mean accepted + 1 over the same rounds."""
    whole = rounds[rounds.method == "tree:*"] if len(rounds) else rounds
    if whole.empty:
        return None
    own = pd.DataFrame(list(whole.member_accepted)).mean()
    out = {"per-round oracle": float((whole.accepted + 1).mean())}
    out.update({f"{k} (same rounds)": float(v + 1) for k, v in own.items()})
    return out


def tree_pairs(drafters: dict) -> list[tuple[str, str]]:
    """(tree drafter, chain drafter) for every pool entry with a ``tree`` whose config, ``tree`` and ``draft_length``
    aside, equals another entry's without one."""

    def rest(cfg: dict) -> dict:
        return {k: v for k, v in cfg.items() if k not in ("tree", "draft_length")}

    chains = [n for n, c in drafters.items() if isinstance(c, dict) and not c.get("tree")]
    return [
        (n, chain)
        for n, c in drafters.items()
        if isinstance(c, dict) and c.get("tree")
        for chain in chains
        if rest(drafters[chain]) == rest(c)
    ]


def tree_lines(run_dir: Path, table: pd.DataFrame) -> list[str]:
    """Each drafter's dynamic tree against its chain in this run (nothing when the pool has no such pair)."""
    from omegaconf import OmegaConf

    config = Path(run_dir) / CONFIG
    if not config.is_file():
        return []
    drafters = (
        OmegaConf.to_container(OmegaConf.load(config), resolve=False).get("pool", {}).get("drafters") or {}
    )
    ran = set(table.method)
    pairs = [(t, c) for t, c in tree_pairs(drafters) if {f"fixed:{t}", f"fixed:{c}"} <= ran]
    if not pairs:
        return []
    ex = load_examples(Path(run_dir).parent, Path(run_dir).name)
    mat = table.set_index("method").mat
    rows = []
    for t, c in pairs:
        v = compare.faster_on(
            ex, f"{t}'s dynamic tree is faster than its chain ({c})", f"fixed:{t}", f"fixed:{c}"
        )
        rows.append(
            {
                "tree": t,
                "shape": str(drafters[t]["tree"]),
                "chain": c,
                "tokens a round (tree)": mat[f"fixed:{t}"],
                "tokens a round (chain)": mat[f"fixed:{c}"],
                "speed tree / chain": v.effect,
                "95% CI": _ci(v),
                "n": v.n,
            }
        )
    return [
        "## Dynamic trees against their chains (the same drafter, paired per query)",
        "",
        to_markdown(pd.DataFrame(rows), floatfmt=".3f"),
        "",
    ]


def write(run_dir: Path, arms: list[str] | None = None, margin: float = BEST_SINGLE_MARGIN) -> Path:
    table, verdicts, facts = tables_of(run_dir, arms, margin)
    md = to_markdown(table, floatfmt=".3f")
    lines = [
        f"# Multi-drafter methods against the best single drafter ({run_dir})",
        "",
        f"Best single drafter over the run: `{facts['best_single']}`. Speedups are over autoregressive decoding "
        "on the same queries (total seconds per token); `vs` columns are speed ratios with paired 95% "
        f"{CI.INTERVAL_TEXT}s over queries; `mat`: mean tokens per target forward (rounds.jsonl)."
        + (
            f" Reference rows, never the best single drafter nor in an oracle: {', '.join(facts['reference'])}."
            if facts["reference"]
            else ""
        ),
        "",
        md,
        "",
    ]
    if facts["per_round_oracle_mat"]:
        po = pd.DataFrame(
            [{"drafting": k, "tokens per round": v} for k, v in facts["per_round_oracle_mat"].items()]
        )
        lines += [
            "## The per-round oracle in hindsight (acceptance, from the tree:* rounds)",
            "",
            to_markdown(po, floatfmt=".3f"),
            "",
        ]
    lines += tree_lines(run_dir, table)
    lines += ["## Verdicts", ""] + [f"- {v.line()}" for v in verdicts] + [""]
    lines += cost_model_lines(run_dir)
    out = Path(run_dir) / "multi_drafter.md"
    atomic_write_text(out, "\n".join(lines))
    print_table(md, title=f"multi-drafter methods vs the best single drafter ({facts['best_single']})")
    for v in verdicts:
        print(f"- {v.line()}")
    return out


def cost_model_lines(run_dir: Path) -> list[str]:
    """The cost model's check (``reproduction/cost_model.py``) and a budget's own calibration, as page lines."""
    from specbench.reproduction import cost_model

    lines = [
        "## The cost model: predicted against measured seconds per token",
        "",
        "Verification `a + b * nodes` fitted over every round, each drafter's mean drafting seconds a round, each "
        "method's mean selection/switching seconds a round and per-query overhead; fitted on half of the queries "
        "and predicting the other half, both ways (`python -m specbench.reproduction.cost_model RUN_DIR`).",
        "",
        to_markdown(cost_model.check(run_dir), floatfmt=".4f"),
        "",
    ]
    lines += [
        "What a tree round's verification costs beyond a chain's of as many nodes (mask, all-row softmax, "
        "members' Block Divergence, cache compaction), against the chain rounds' own line:",
        "",
        to_markdown(cost_model.tree_overhead(run_dir), floatfmt=".3f"),
        "",
    ]
    cal = cost_model.budget_calibration(run_dir)
    if cal is not None:
        lines += [
            "## The budget's own estimates against its rounds",
            "",
            "Expected accepted tokens a round (its calibrated node estimates) and the seconds it predicted for "
            "drafting and verification, against what the same rounds measured.",
            "",
            to_markdown(cal, floatfmt=".3f"),
            "",
        ]
    return lines


def trees_exhibit(root: Path, published, layout) -> Exhibit:
    """The report's exhibit: the table of :func:`tables_of` on the paper-scale trees run (``metasd/trees``)."""
    run = Path(root) / METASD_TREES.dir
    if not (run / EXAMPLES).is_file():
        raise NotRun(METASD_TREES.dir)
    table, verdicts, facts = tables_of(run)
    notes = (
        f"Best single drafter over the run: {facts['best_single']}. Speedups over autoregressive decoding on the "
        "same queries; the ratios to the best single drafter and to the per-task oracle carry paired 95% "
        f"{CI.INTERVAL_TEXT}s over queries. Not a paper's table: this project's multi-drafter methods."
    )
    return Exhibit(
        "Multi-drafter decoding: token trees and the router against the best single drafter",
        table,
        verdicts,
        notes,
    )


TREES = ExhibitSpec("metasd/trees", trees_exhibit, (METASD_TREES,), scales=("paper",))


USAGE = (
    "usage: python -m specbench.reproduction.multi_drafter RUN_DIR [--singles a,b,...] [--margin X]\n"
    "  --singles: the drafters that count as single drafters (the others' fixed: rows are reference rows)\n"
    f"  --margin: the multiple of the best single drafter the other methods are judged against ({BEST_SINGLE_MARGIN})"
)


def parse_args(argv: list[str]) -> tuple[Path, list[str] | None, float]:
    """``RUN_DIR [--singles a,b] [--margin X]`` -> (run directory, singles or None, margin)."""
    if not argv or argv[0].startswith("-"):
        raise SpecbenchError("no run directory given", USAGE)
    run, rest, arms, margin = Path(argv[0]), list(argv[1:]), None, BEST_SINGLE_MARGIN
    while rest:
        flag = rest.pop(0)
        if flag not in ("--singles", "--margin") or not rest:
            raise SpecbenchError(
                f"unexpected argument {flag!r}"
                if flag not in ("--singles", "--margin")
                else f"{flag} needs a value",
                USAGE,
            )
        value = rest.pop(0)
        if flag == "--singles":
            arms = [a for a in value.split(",") if a]
        else:
            try:
                margin = float(value)
            except ValueError:
                raise SpecbenchError(f"--margin {value!r} is not a number", USAGE) from None
    return run, arms, margin


if __name__ == "__main__":
    try:
        args = parse_args(sys.argv[1:])
        existing(args[0], "the eval run", "pass the directory of an eval run (make trees-cpu writes one)")
        print(f"written: {write(*args)}")
    except SpecbenchError as exc:
        exit_on(exc)
