"""Does a cost model of the round explain each method's time? Cross-fitted, from one eval run's records.

The model: a verification forward costs ``a + b * nodes`` (least squares over every round of every method), a
drafter costs its mean drafting seconds a round (from the rounds it drafted alone), and a method adds its mean
selection and switching seconds a round and its mean per-query overhead (prefill, embedding). Fitted on half of
the queries (by id) and predicting the other half, both ways, so no query predicts itself. Per method: predicted
against measured seconds per generated token. And for rounds a budget built (``selector=budget``): its own
expected accepted tokens and predicted seconds against what the rounds measured.

    python -m specbench.reproduction.cost_model RUN_DIR
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.errors import SpecbenchError, exit_on
from specbench.files import existing
from specbench.reproduction.inputs import load_examples, load_round_values

FIELDS = (
    "query_id",
    "method",
    "arm",
    "members",
    "drafted",
    "accepted",
    "t_select",
    "t_draft",
    "t_verify",
    "t_switch",
    "expected",
    "predicted_s",
)


def _fold(query_id) -> int:
    return zlib.crc32(str(query_id).encode()) % 2


def fit(rounds: pd.DataFrame, examples: pd.DataFrame) -> dict:
    """The model's coefficients from ``rounds`` and ``examples`` (the same queries)."""
    n, t = rounds.drafted.to_numpy(float), rounds.t_verify.to_numpy(float)
    b, a = np.polyfit(n, t, 1) if len(set(n)) > 1 else (0.0, float(t.mean()))
    alone = rounds[rounds.members.isna()]
    drafting = alone.groupby("arm").t_draft.mean().to_dict()
    per_round = (rounds.t_select + rounds.t_switch).groupby(rounds.method).mean().to_dict()
    spent = (
        (rounds.t_select + rounds.t_draft + rounds.t_verify + rounds.t_switch)
        .groupby([rounds.query_id, rounds.method])
        .sum()
    )
    ex = examples.set_index(["query_id", "method"]).seconds
    overhead = (ex - spent.reindex(ex.index).fillna(0.0)).groupby(level="method").mean().to_dict()
    return {
        "a": float(a),
        "b": float(max(b, 0.0)),
        "drafting": drafting,
        "per_round": per_round,
        "overhead": overhead,
    }


def predict(model: dict, rounds: pd.DataFrame) -> pd.Series:
    """Predicted seconds of each (query, method) generation from its rounds."""

    def drafting(row) -> float:
        names = row.members if isinstance(row.members, list) else [row.arm]
        return sum(model["drafting"].get(m, 0.0) for m in names)

    cost = (
        model["a"]
        + model["b"] * rounds.drafted
        + rounds.apply(drafting, axis=1)
        + rounds.method.map(model["per_round"]).fillna(0.0)
    )
    total = cost.groupby([rounds.query_id, rounds.method]).sum()
    return total + total.index.get_level_values("method").map(lambda m: model["overhead"].get(m, 0.0))


def check(run_dir: Path) -> pd.DataFrame:
    """Per method: measured and predicted seconds per token (cross-fitted), and their ratio."""
    run_dir = Path(run_dir)
    ex = load_examples(run_dir.parent, run_dir.name)
    rounds = load_round_values(run_dir.parent, run_dir.name, None, FIELDS)
    if ex.empty or rounds.empty:
        raise SpecbenchError(
            f"{run_dir}: no examples or rounds to fit", "point at a finished `specbench eval` run"
        )
    ex = ex[["query_id", "method", "seconds", "new_tokens"]]
    ex_fold, rd_fold = ex.query_id.map(_fold), rounds.query_id.map(_fold)
    predicted = []
    for k in (0, 1):
        model = fit(rounds[rd_fold != k], ex[ex_fold != k])
        predicted.append(predict(model, rounds[rd_fold == k]))
    pred = pd.concat(predicted)
    ex = ex.set_index(["query_id", "method"])
    ex["predicted"] = pred.reindex(ex.index)
    ex = ex.dropna()
    g = ex.groupby(level="method")[["seconds", "predicted", "new_tokens"]].sum()
    table = pd.DataFrame(
        {"measured s/token": g.seconds / g.new_tokens, "predicted s/token": g.predicted / g.new_tokens}
    )
    table["predicted / measured"] = table["predicted s/token"] / table["measured s/token"]
    return table.reset_index()


def tree_overhead(run_dir: Path, chains: tuple[str, ...] | None = None) -> pd.DataFrame:
    """What a tree round's verification costs beyond a chain's of as many nodes: ``t_verify`` against the line
    ``a + b * nodes`` fitted on chain rounds alone, by round kind (the mask, the all-row softmax, the members'
    Block Divergence, the cache compaction); in ms and in target steps (``a``). ``chains``: the methods whose
    rounds fit the chain line (default: every round that verified no tree)."""
    run_dir = Path(run_dir)
    rounds = load_round_values(run_dir.parent, run_dir.name, None, FIELDS + ("tree_size",))
    if rounds.empty:
        raise SpecbenchError(f"{run_dir}: no rounds", "point at a finished `specbench eval` run")
    tree = rounds.arm.astype(str).str.startswith("tree:") | (rounds.tree_size.fillna(0) > 0)
    chain = rounds[~tree & (rounds.drafted > 0) & (rounds.method.isin(chains) if chains else True)]
    b, a = np.polyfit(chain.drafted.to_numpy(float), chain.t_verify.to_numpy(float), 1)
    kind = np.where(tree, "tree", np.where(rounds.index.isin(chain.index), "chain", "other"))
    rounds = rounds.assign(residual=rounds.t_verify - (a + b * rounds.drafted), kind=kind)
    g = rounds[(rounds.drafted > 0) & (rounds.kind != "other")].groupby("kind")
    return pd.DataFrame(
        {
            "rounds": g.size(),
            "mean nodes": g.drafted.mean(),
            "verify beyond the chain line (ms)": 1000 * g.residual.mean(),
            "in target steps": g.residual.mean() / a,
        }
    ).reset_index()


def budget_calibration(run_dir: Path) -> pd.DataFrame | None:
    """For methods whose rounds a budget built: mean expected and realised accepted tokens a round, and the sum of
    its predicted round seconds against the measured drafting and verification seconds."""
    run_dir = Path(run_dir)
    rounds = load_round_values(run_dir.parent, run_dir.name, None, FIELDS)
    built = rounds[rounds.expected.notna()] if len(rounds) else rounds
    if built.empty:
        return None
    g = built.groupby("method")
    out = pd.DataFrame(
        {
            "rounds": g.size(),
            "expected accepted": g.expected.mean(),
            "realised accepted": g.accepted.mean(),
            "predicted s": g.predicted_s.sum(),
            "measured s (draft + verify)": (g.t_draft.sum() + g.t_verify.sum()),
        }
    )
    out["predicted / measured"] = out["predicted s"] / out["measured s (draft + verify)"]
    return out.reset_index()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m specbench.reproduction.cost_model RUN_DIR")
    try:
        existing(
            sys.argv[1],
            "the eval run",
            "pass the directory of an eval run (specbench eval ... hydra.run.dir=DIR)",
        )
        print(check(Path(sys.argv[1])).to_string(index=False))
        print(tree_overhead(Path(sys.argv[1])).to_string(index=False))
        cal = budget_calibration(Path(sys.argv[1]))
        if cal is not None:
            print(cal.to_string(index=False))
    except SpecbenchError as exc:
        exit_on(exc)
