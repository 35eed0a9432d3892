"""``specbench train-policy``: a query -> arm policy from collected rows (offline contextual bandit).

The reward of arm a on query i (``reward.source=proxy``, the default) is Huang et al.'s
``r = alpha * alignment + (1 - alpha) * (1 - cost)`` with ``cost`` the arm's cost divided by the
largest cost among the arms trained on for that query (``reward.cost=params|measured|speed``), and the
alignment the ROUGE-L of the drafter's own output (``reward.alignment=output``) or the acceptance of its
drafts in its measured speculative run (``acceptance``, which scores draft heads too); the autoregressive
arm has alignment 1 and the target's cost. ``reward.source=measured`` uses the speculative runs of
``collect.measure_speculative`` instead: ``r = speedup / max speedup`` over the arms of that query (alpha
unused). The matrices are ``specbench.policy.scores``.

Outputs in the run directory: ``policy.pt`` (checkpoint), ``metrics.json``, ``history.csv``,
``summary.md`` and, with ``sweep.alpha`` / ``sweep.n_examples``, the alpha trade-off and
data-efficiency tables and plots. Speedups here are replayed from the collect run's measured
speculative runs on the validation queries (total autoregressive seconds / total seconds of the
chosen arms); ``specbench eval selector=policy`` measures them live.
"""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text
from specbench.pipelines.collected import collection_settings, incomplete, read_rows
from specbench.pipelines.policy_plots import plot_alpha, plot_data_efficiency
from specbench.pipelines.session.run_dir import differences, start_run
from specbench.pipelines.tables import print_table, write_csv, write_tables
from specbench.policy import TrainConfig, TrainResult, save_checkpoint
from specbench.policy.scores import RewardSpec, proxy_check, replay, rewards
from specbench.records import (
    ALPHA_SWEEP,
    ALPHA_SWEEP_QUERIES_CSV,
    DATA_EFFICIENCY,
    DATA_EFFICIENCY_QUERIES_CSV,
    HISTORY_CSV,
    METRICS,
)
from specbench.training.reinforce import held_out, train_policy

log = logging.getLogger(__name__)

MIN_VALIDATION = 2  # held-out rows a policy's validation numbers need at least


def pick_arms(rows: list[dict], requested, spec: RewardSpec) -> list[str]:
    """The arms to train on: ``train.arms`` if given, else every arm that can be scored."""
    available = list(rows[0]["arms"])
    if requested:
        unknown = [a for a in requested if a not in available]
        if unknown:
            raise SpecbenchError(
                f"train.arms: {', '.join(unknown)} not in the collected rows",
                f"pick from: {', '.join(available)}",
            )
        return list(requested)
    R = rewards(rows, available, spec)
    scored = [a for i, a in enumerate(available) if not torch.isnan(R[:, i]).all()]
    dropped = [a for a in available if a not in scored]
    if dropped:
        log.warning(
            "arms without a score under %s are left out: %s (they cannot generate alone; collect with "
            "collect.measure_speculative=true and use reward.alignment=acceptance or reward.source=measured "
            "to include them)",
            spec.describe(),
            ", ".join(dropped),
        )
    return scored


def acceptance_rule(rows: list[dict], arms: list[str], limit: float) -> tuple[list[str], dict]:
    """``train.max_acceptance``: the drafters of ``arms`` whose acceptance (accepted / drafted tokens of their
    measured speculative runs, over every collected row) is at most ``limit``, with the autoregressive arm when it is
    among ``arms``; when no drafter meets it, the one with the least acceptance (the rule's record says so). Returns
    the arms kept and the record (``metrics.json``'s ``arms_rule``)."""
    acceptance = {}
    for a in arms:
        if a == "autoregressive":
            continue
        runs = [r["arms"][a].get("spec") or {} for r in rows if a in r["arms"]]
        drafted = sum(float(x.get("drafted") or 0) for x in runs)
        if not drafted:
            raise SpecbenchError(
                f"train.max_acceptance: the rows hold no measured speculative run of {a}",
                "collect with collect.measure_speculative=true, or drop train.max_acceptance",
            )
        acceptance[a] = sum(float(x.get("accepted") or 0) for x in runs) / drafted
    kept = [a for a, v in acceptance.items() if v <= limit]
    satisfied = bool(kept)
    if not kept:
        kept = [min(acceptance, key=acceptance.get)] if acceptance else []
        log.warning(
            "train.max_acceptance=%g: no drafter's acceptance is that low (%s); keeping %s, the lowest",
            limit,
            ", ".join(f"{a} {v:.3f}" for a, v in acceptance.items()),
            ", ".join(kept),
        )
    chosen = [a for a in arms if a == "autoregressive" or a in kept]
    return chosen, {"max_acceptance": limit, "acceptance": acceptance, "kept": kept, "satisfied": satisfied}


def _train_config(cfg: DictConfig, **overrides) -> TrainConfig:
    t = OmegaConf.to_container(cfg.train, resolve=True)
    t.pop("arms", None)
    t.pop("max_acceptance", None)
    t.pop("allow_incomplete", None)
    t["hidden"] = tuple(t.get("hidden") or ())
    known = set(TrainConfig.__dataclass_fields__)
    unknown = sorted(set(t) - known)
    if unknown:
        raise SpecbenchError(
            f"unknown train option(s): {', '.join(unknown)}", f"known: {', '.join(sorted(known))}"
        )
    return replace(TrainConfig(**t), **overrides)


def check_held_out(n: int, val_fraction: float, minimum: int = MIN_VALIDATION) -> None:
    """Refuse a split that holds out fewer than ``minimum`` of the ``n`` rows: the validation reward,
    the best epoch and the replayed speedups would come from too few rows, or the training rows."""
    n_val = held_out(n, val_fraction)
    if n_val >= minimum:
        return
    if val_fraction > 0:
        start = max(2, int((minimum - 0.5) / val_fraction) - 2)  # held_out rounds n * val_fraction
        needed = next(m for m in itertools.count(start) if held_out(m, val_fraction) >= minimum)
        more = f"collect at least {needed} queries (specbench collect dataset.limit=...)"
    else:
        more = "set train.val_fraction > 0"
    raise SpecbenchError(
        f"train-policy: {n} collected row(s) with train.val_fraction={val_fraction} leave {n_val} "
        f"for validation; at least {minimum} held-out rows are needed (validation numbers must not "
        "come from the rows the policy was trained on)",
        f"{more}, or raise train.val_fraction (every split keeps at least one training row)",
    )


def collection(sources: list[str]) -> dict:
    """The collect settings of ``sources``, which must match: a policy is trained on the embeddings
    of one target (model, dtype, prompt), one pooling and one pool, scored under one set of decoding
    and collect settings. Rows of different datasets may be combined (``dataset`` is not compared;
    their query ids must not collide, see ``read_rows``)."""
    sigs = [collection_settings(src) for src in sources]
    mine = {k: v for k, v in sigs[0].items() if k != "dataset"}
    for src, sig in zip(sources[1:], sigs[1:]):
        diff = differences(mine, {k: v for k, v in sig.items() if k != "dataset"})
        if diff:
            raise SpecbenchError(
                f"{sources[0]} and {src} were collected with different settings, so their rows "
                "cannot train one policy; differs in: " + "; ".join(diff),
                "train on collections of one target, pool, embedding pooling, decoding and collect "
                "settings (collections of different datasets may be combined)",
            )
    return sigs[0]


def embedding_spec(sig: dict, dim: int) -> dict:
    """How a collection's queries were embedded (from its settings), kept in the policy checkpoint:
    ``eval selector=policy`` refuses a policy trained for another target. (Collections made before
    the settings held the whole config stored the target as a string, with dtype and prompt beside.)"""
    target = sig.get("target")
    t = (
        target
        if isinstance(target, dict)
        else {"model": target, "dtype": sig.get("dtype"), "prompt": sig.get("prompt")}
    )
    return {
        "target": t.get("model"),
        "dtype": t.get("dtype"),
        "prompt": t.get("prompt"),
        "pooling": (sig.get("embedding") or {}).get("pooling", "mean"),
        "dim": dim,
    }


def fit(rows, X, arms, cfg, spec: RewardSpec, **overrides) -> tuple[TrainResult, list[str]]:
    R = rewards(rows, arms, spec)
    result = train_policy(X, R, _train_config(cfg, **overrides), arms)
    policy = result.policy()
    chosen = [policy.choose(X[int(i)]) for i in result.val_idx]
    return result, chosen


def check_complete(sources: list[str], allow: bool) -> None:
    """Refuse to train on an incomplete collection (missing shard files, a collect that stopped before all
    its rows: ``collected.incomplete``) unless ``train.allow_incomplete``: then warn."""
    problems = incomplete(sources)
    if not problems:
        return
    what = f"the collection in {', '.join(sources)} is incomplete: " + "; ".join(problems)
    if allow:
        log.warning("train.allow_incomplete=true: training on an incomplete collection (%s)", what)
        return
    raise SpecbenchError(
        f"train-policy: {what}; a policy trained on it would silently see only part of the queries",
        "finish the collection: rerun its `specbench collect` command into the same directory (it resumes; a "
        "missing shard: collect.shard=<i> collect.num_shards=<n>) and pass every shard's directory, or train on "
        "the rows there are with train.allow_incomplete=true",
    )


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    data = cfg.get("data")
    if data is None:
        raise SpecbenchError(
            "no collected data given", "pass data=<directory of specbench collect> (or a list)"
        )
    out = start_run(cfg, output_dir, command="train-policy")
    sources = [str(d) for d in (data if OmegaConf.is_list(data) else [data])]
    sig = collection(sources)
    check_complete(sources, bool(OmegaConf.select(cfg, "train.allow_incomplete", default=False)))
    rows = read_rows(sources)
    if not rows:
        raise SpecbenchError(
            f"no rows in {', '.join(sources)}", "run specbench collect into that directory first"
        )
    check_held_out(len(rows), float(cfg.train.val_fraction))
    spec = RewardSpec.of(cfg.reward)
    arms = pick_arms(rows, cfg.train.get("arms"), spec)
    rule = None
    if cfg.train.get("max_acceptance") is not None:
        arms, rule = acceptance_rule(rows, arms, float(cfg.train.max_acceptance))
    X = torch.tensor([r["embedding"] for r in rows], dtype=torch.float64)
    alpha = spec.alpha

    result, chosen = fit(rows, X, arms, cfg, spec)
    metrics = dict(result.metrics)
    metrics["speedup_replayed"] = replay(rows, result.val_idx, arms, chosen)
    metrics["proxy_vs_measured"] = proxy_check(rows, [a for a in rows[0]["arms"]], spec)
    metrics["arms"] = arms
    if rule is not None:
        metrics["arms_rule"] = rule
    embedding = embedding_spec(sig, int(X.shape[1]))
    save_checkpoint(
        out / "policy.pt",
        result,
        arms=arms,
        embedding=embedding,
        alpha=alpha,
        config=OmegaConf.to_container(cfg, resolve=True),
        training_queries=[r["fingerprint"] for r in rows if r.get("fingerprint")],
        pool=sig.get("pool"),
    )
    write_csv(pd.DataFrame(result.history), out / HISTORY_CSV)

    table, notes = summary_of(metrics, arms, spec)
    md = write_tables(table, out, stem="summary", title="specbench train-policy", notes=notes)

    sweeps = {}
    if cfg.sweep.get("alpha"):
        sweeps["alpha"] = alpha_sweep(rows, X, arms, cfg, spec, [float(a) for a in cfg.sweep.alpha], out)
    if cfg.sweep.get("n_examples"):
        sweeps["n_examples"] = data_efficiency(
            rows, X, arms, cfg, spec, [int(n) for n in cfg.sweep.n_examples], out
        )
    atomic_write_text(out / METRICS, json.dumps({**metrics, "sweeps": sweeps}, indent=2, default=float))
    print_table(md, title=f"train-policy ({out}; policy.pt, metrics.json, history.csv)")
    print(notes)
    return out


def summary_of(metrics: dict, arms: list[str], spec: RewardSpec) -> tuple[pd.DataFrame, str]:
    """The summary table (the policy against the oracle, the best single arm and a random arm; each arm alone when
    speculative runs were measured) and its notes."""
    table = pd.DataFrame(
        [
            {"choice": name, "val_reward": metrics[key]}
            for name, key in [
                ("policy", "policy"),
                ("oracle (best arm per query)", "oracle"),
                (f"best single arm ({metrics['best_single_arm']})", "best_single"),
                ("random arm", "random"),
            ]
        ]
    )
    sp = metrics["speedup_replayed"]
    if sp:
        table["speedup_replayed"] = [
            sp["policy"],
            sp["oracle"],
            sp.get(metrics["best_single_arm"]),
            sp["random"],
        ]
        single = pd.DataFrame([{"choice": f"always {a}", "speedup_replayed": sp[a]} for a in arms])
        table = pd.concat([table, single], ignore_index=True)
    notes = (
        f"{metrics['n_val']} validation queries ({metrics['n_train']} for training; the validation set also "
        f"picked the epoch, {metrics['best_epoch']}); {spec.describe()}; policy shares: "
        + ", ".join(f"{a} {s:.2f}" for a, s in metrics["share"].items())
        + ". speedup_replayed: total autoregressive seconds / total seconds of the chosen arms' measured "
        "speculative runs (collect.measure_speculative) on the validation queries."
    )
    if metrics["proxy_vs_measured"]:
        pc = metrics["proxy_vs_measured"]
        notes += (
            f" Proxy vs measured speed over {pc['queries']} queries: mean Spearman {pc['spearman']:.3f}, "
            f"top-1 agreement {pc['top1_agreement']:.3f}."
        )
    return table, notes


def alpha_sweep(rows, X, arms, cfg, spec: RewardSpec, alphas: list[float], out: Path) -> list[dict]:
    """Chosen-arm shares, validation reward and replayed speedup as alpha sweeps (one policy per alpha); each alpha's
    chosen arm per validation query in ``alpha_sweep_queries.csv`` (the same validation queries at every alpha, so
    the choice's shift with alpha can be paired per query)."""
    table, per_query = [], []
    for a in alphas:
        result, chosen = fit(rows, X, arms, cfg, replace(spec, alpha=a))
        sp = replay(rows, result.val_idx, arms, chosen)
        per_query += [
            {"alpha": a, "query_id": rows[i]["query_id"], "task": rows[i].get("task"), "arm": arm}
            for i, arm in zip(result.val_idx.tolist(), chosen)
        ]
        table.append(
            {
                "alpha": a,
                "val_reward": result.metrics["policy"],
                "speedup_replayed": sp.get("policy"),
                **{f"share_{arm}": s for arm, s in result.metrics["share"].items()},
            }
        )
    df = pd.DataFrame(table)
    write_csv(pd.DataFrame(per_query), out / ALPHA_SWEEP_QUERIES_CSV)
    write_tables(
        df,
        out,
        stem=ALPHA_SWEEP,
        title="alpha trade-off",
        notes="One policy per alpha (same seed and split). share_<arm>: share of validation queries "
        "given that arm; speedup_replayed as in summary.md.",
    )
    plot_alpha(df, arms, out / "alpha_sweep.png")
    return table


def query_oracle(row: dict, arms: list[str]) -> str | None:
    """The arm of ``arms`` whose measured speculative run of ``row``'s query took the fewest seconds per token."""
    timed = {}
    for a in arms:
        run = row["arms"].get(a, {}).get("spec") or {}
        if run.get("seconds") and run.get("new_tokens"):
            timed[a] = float(run["seconds"]) / float(run["new_tokens"])
    return min(timed, key=timed.get) if timed else None


def validation_row(row: dict, arm: str, arms: list[str], n_train: int) -> dict:
    """One validation query of a data-efficiency sweep: the arm chosen at ``n_train`` training queries with its
    speculative run's seconds and tokens, the autoregressive run's, and the query's per-query oracle (the arm with the
    fewest seconds per token on it) with its own."""
    run = row["arms"][arm].get("spec") or {}
    ar = row["arms"]["autoregressive"].get("spec") or {}
    best = query_oracle(row, arms)
    oracle = (row["arms"][best].get("spec") or {}) if best else {}
    return {
        "n_examples": n_train,
        "query_id": row["query_id"],
        "task": row.get("task"),
        "arm": arm,
        "seconds": run.get("seconds"),
        "new_tokens": run.get("new_tokens"),
        "ar_seconds": ar.get("seconds"),
        "ar_tokens": ar.get("new_tokens"),
        "oracle_arm": best,
        "oracle_seconds": oracle.get("seconds"),
        "oracle_tokens": oracle.get("new_tokens"),
    }


def data_efficiency(rows, X, arms, cfg, spec: RewardSpec, sizes: list[int], out: Path) -> list[dict]:
    """One policy per training-set size on the same validation queries: ``data_efficiency.csv`` (aggregates) and
    ``data_efficiency_queries.csv`` (each size's chosen arm per validation query with that arm's speculative seconds
    and tokens and the autoregressive seconds, so sizes can be compared paired per query)."""
    table, per_query = [], []
    for n in sizes:
        result, chosen = fit(rows, X, arms, cfg, spec, n_examples=n)
        if any(t["n_examples"] == result.metrics["n_train"] for t in table):
            log.warning(
                "sweep.n_examples=%d: only %d training queries exist, so it repeats a size already fitted "
                "(skipped)",
                n,
                result.metrics["n_train"],
            )
            continue
        sp = replay(rows, result.val_idx, arms, chosen)
        table.append(
            {
                "n_examples": result.metrics["n_train"],
                "val_reward": result.metrics["policy"],
                "oracle_reward": result.metrics["oracle"],
                "speedup_replayed": sp.get("policy"),
                "oracle_speedup": sp.get("oracle"),
                # the best arm alone on these queries (in hindsight) and a uniformly random arm: the floor to beat
                "best_single_speedup": max((sp[a] for a in arms if sp.get(a) is not None), default=None),
                "random_speedup": sp.get("random"),
            }
        )
        per_query += [
            validation_row(rows[i], arm, arms, result.metrics["n_train"])
            for i, arm in zip(result.val_idx.tolist(), chosen)
        ]
    df = pd.DataFrame(table)
    write_csv(pd.DataFrame(per_query), out / DATA_EFFICIENCY_QUERIES_CSV)
    write_tables(
        df,
        out,
        stem=DATA_EFFICIENCY,
        title="data efficiency",
        notes="One policy per training-set size (same validation queries; per query: "
        "data_efficiency_queries.csv).",
    )
    plot_data_efficiency(df, out / "data_efficiency.png")
    return table
