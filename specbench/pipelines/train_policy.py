"""``specbench train-policy``: a query -> arm policy from collected rows (offline contextual bandit).

The reward of arm a on query i (``reward.source=proxy``, the default) is
``r = alpha * alignment + (1 - alpha) * (1 - cost)`` with ``cost`` the arm's cost divided by the
largest cost among the arms trained on for that query (``reward.cost=params|measured``; the
autoregressive arm has alignment 1 and the target's cost). ``reward.source=measured`` uses the
speculative runs of ``collect.measure_speculative`` instead: ``r = speedup / max speedup`` over the
arms of that query (alpha unused), which also scores drafters that cannot generate alone.

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
import math
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from specbench.drafters import AUTOREGRESSIVE
from specbench.errors import SpecbenchError
from specbench.pipelines.collect import collection_settings, incomplete, read_rows
from specbench.pipelines.tables import print_table, pyplot, write_csv, write_tables
from specbench.pipelines.run_dir import differences, start_run
from specbench.records import atomic_write_text
from specbench.policy import TrainConfig, TrainResult, check_alpha, reward_matrix, save_checkpoint
from specbench.training.policy import held_out, train_policy

log = logging.getLogger(__name__)

COSTS = ("params", "measured")
MIN_VALIDATION = 2  # held-out rows a policy's validation numbers need at least
SOURCES = ("proxy", "measured")


def _matrix(rows: list[dict], arms: list[str], get) -> torch.Tensor:
    vals = [[get(r["arms"].get(a) or {}) for a in arms] for r in rows]
    return torch.tensor([[math.nan if v is None else float(v) for v in row] for row in vals], dtype=torch.float64)


def cost_matrix(rows: list[dict], arms: list[str], kind: str) -> torch.Tensor:
    """Per-query cost of each arm relative to the largest among ``arms`` (so in [0, 1])."""
    if kind not in COSTS:
        raise SpecbenchError(f"unknown reward.cost '{kind}'", f"use one of: {', '.join(COSTS)}")

    def get(rec):
        measured = rec.get("cost_measured")
        return measured if kind == "measured" and measured is not None else rec.get("cost_params")
    cost = _matrix(rows, arms, get)
    top = cost.nan_to_num(0.0).max(dim=1, keepdim=True).values.clamp_min(1e-12)
    return cost / top


def speedup_matrix(rows: list[dict], arms: list[str]) -> torch.Tensor:
    """Measured speedup over autoregressive of each arm's speculative run (NaN where not measured)."""
    return _matrix(rows, arms, lambda rec: (rec.get("spec") or {}).get("speedup"))


def seconds_matrix(rows: list[dict], arms: list[str]) -> torch.Tensor:
    return _matrix(rows, arms, lambda rec: (rec.get("spec") or {}).get("seconds"))


def rewards(rows: list[dict], arms: list[str], alpha: float, cost: str, source: str) -> torch.Tensor:
    if source == "proxy":
        return reward_matrix(_matrix(rows, arms, lambda rec: rec.get("alignment")), cost_matrix(rows, arms, cost),
                             check_alpha(float(alpha)))
    if source == "measured":
        sp = speedup_matrix(rows, arms)
        if torch.isnan(sp).all():
            raise SpecbenchError("reward.source=measured but the rows have no speculative runs",
                                 "collect with collect.measure_speculative=true, or use reward.source=proxy")
        return sp / sp.nan_to_num(0.0).max(dim=1, keepdim=True).values.clamp_min(1e-12)
    raise SpecbenchError(f"unknown reward.source '{source}'", f"use one of: {', '.join(SOURCES)}")


def pick_arms(rows: list[dict], requested, cfg_reward) -> list[str]:
    """The arms to train on: ``train.arms`` if given, else every arm that can be scored."""
    available = list(rows[0]["arms"])
    if requested:
        unknown = [a for a in requested if a not in available]
        if unknown:
            raise SpecbenchError(f"train.arms: {', '.join(unknown)} not in the collected rows",
                                 f"pick from: {', '.join(available)}")
        return list(requested)
    R = rewards(rows, available, float(cfg_reward.alpha), str(cfg_reward.cost), str(cfg_reward.source))
    scored = [a for i, a in enumerate(available) if not torch.isnan(R[:, i]).all()]
    dropped = [a for a in available if a not in scored]
    if dropped:
        log.warning("arms without a score under reward.source=%s are left out: %s (they cannot generate alone; "
                    "collect with collect.measure_speculative=true and use reward.source=measured to include them)",
                    cfg_reward.source, ", ".join(dropped))
    return scored


def replay(rows: list[dict], idx: torch.Tensor, arms: list[str], chosen: list[str]) -> dict[str, float]:
    """Speedups replayed from the measured speculative runs on the queries ``idx``: the chosen arms,
    each single arm, the per-query fastest arm (oracle) and a uniformly random arm (expected)."""
    sub = [rows[int(i)] for i in idx]
    secs = seconds_matrix(sub, arms)
    ar = seconds_matrix(sub, [AUTOREGRESSIVE])[:, 0]
    if torch.isnan(secs).any() or torch.isnan(ar).any() or not len(sub):
        return {}
    total_ar = float(ar.sum())
    col = {a: i for i, a in enumerate(arms)}
    out = {"policy": total_ar / float(sum(secs[j, col[a]] for j, a in enumerate(chosen)))}
    for a in arms:
        out[a] = total_ar / float(secs[:, col[a]].sum())
    out["oracle"] = total_ar / float(secs.min(dim=1).values.sum())
    out["random"] = total_ar / float(secs.mean(dim=1).sum())
    return out


def proxy_check(rows: list[dict], arms: list[str], alpha: float, cost: str) -> dict[str, float] | None:
    """How well the proxy reward ranks arms against the measured speedup, over the rows where both
    exist for at least two arms: mean Spearman rank correlation and top-1 agreement."""
    proxy = rewards(rows, arms, alpha, cost, "proxy")
    speed = speedup_matrix(rows, arms)
    rhos, top = [], []
    for p, s in zip(proxy, speed):
        ok = ~(torch.isnan(p) | torch.isnan(s))
        if int(ok.sum()) < 2:
            continue
        rp, rs = _ranks(p[ok]), _ranks(s[ok])
        if rp.std() > 0 and rs.std() > 0:
            rhos.append(float(torch.corrcoef(torch.stack([rp, rs]))[0, 1]))
        top.append(float(p[ok].argmax() == s[ok].argmax()))
    if not top:
        return None
    return {"spearman": sum(rhos) / len(rhos) if rhos else float("nan"), "top1_agreement": sum(top) / len(top),
            "queries": len(top)}


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Average ranks (ties share their mean rank)."""
    order = x.argsort()
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(len(x), dtype=x.dtype)
    for v in x.unique():
        tie = x == v
        ranks[tie] = ranks[tie].mean()
    return ranks


def _train_config(cfg: DictConfig, **overrides) -> TrainConfig:
    t = OmegaConf.to_container(cfg.train, resolve=True)
    t.pop("arms", None)
    t.pop("allow_incomplete", None)
    t["hidden"] = tuple(t.get("hidden") or ())
    known = set(TrainConfig.__dataclass_fields__)
    unknown = sorted(set(t) - known)
    if unknown:
        raise SpecbenchError(f"unknown train option(s): {', '.join(unknown)}", f"known: {', '.join(sorted(known))}")
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
    raise SpecbenchError(f"train-policy: {n} collected row(s) with train.val_fraction={val_fraction} leave {n_val} "
                         f"for validation; at least {minimum} held-out rows are needed (validation numbers must not "
                         "come from the rows the policy was trained on)",
                         f"{more}, or raise train.val_fraction (every split keeps at least one training row)")


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
            raise SpecbenchError(f"{sources[0]} and {src} were collected with different settings, so their rows "
                                 "cannot train one policy; differs in: " + "; ".join(diff),
                                 "train on collections of one target, pool, embedding pooling, decoding and collect "
                                 "settings (collections of different datasets may be combined)")
    return sigs[0]


def embedding_spec(sig: dict, dim: int) -> dict:
    """How a collection's queries were embedded (from its settings), kept in the policy checkpoint:
    ``eval selector=policy`` refuses a policy trained for another target. (Collections made before
    the settings held the whole config stored the target as a string, with dtype and prompt beside.)"""
    target = sig.get("target")
    t = target if isinstance(target, dict) else {"model": target, "dtype": sig.get("dtype"), "prompt": sig.get("prompt")}
    return {"target": t.get("model"), "dtype": t.get("dtype"), "prompt": t.get("prompt"),
            "pooling": (sig.get("embedding") or {}).get("pooling", "mean"), "dim": dim}


def fit(rows, X, arms, cfg, alpha: float, **overrides) -> tuple[TrainResult, list[str]]:
    R = rewards(rows, arms, alpha, str(cfg.reward.cost), str(cfg.reward.source))
    result = train_policy(X, R, _train_config(cfg, **overrides), arms)
    policy = result.policy()
    chosen = [policy.choose(X[int(i)]) for i in result.val_idx]
    return result, chosen


def check_complete(sources: list[str], allow: bool) -> None:
    """Refuse to train on an incomplete collection (missing shard files, a collect that stopped before all
    its rows: ``collect.incomplete``) unless ``train.allow_incomplete``: then warn."""
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
        "the rows there are with train.allow_incomplete=true")


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    data = cfg.get("data")
    if data is None:
        raise SpecbenchError("no collected data given", "pass data=<directory of specbench collect> (or a list)")
    out = start_run(cfg, output_dir, command="train-policy")
    sources = [str(d) for d in (data if OmegaConf.is_list(data) else [data])]
    sig = collection(sources)
    check_complete(sources, bool(OmegaConf.select(cfg, "train.allow_incomplete", default=False)))
    rows = read_rows(sources)
    if not rows:
        raise SpecbenchError(f"no rows in {', '.join(sources)}", "run specbench collect into that directory first")
    check_held_out(len(rows), float(cfg.train.val_fraction))
    arms = pick_arms(rows, cfg.train.get("arms"), cfg.reward)
    X = torch.tensor([r["embedding"] for r in rows], dtype=torch.float64)
    alpha = float(cfg.reward.alpha)

    result, chosen = fit(rows, X, arms, cfg, alpha)
    metrics = dict(result.metrics)
    metrics["speedup_replayed"] = replay(rows, result.val_idx, arms, chosen)
    metrics["proxy_vs_measured"] = proxy_check(rows, [a for a in rows[0]["arms"]], alpha, str(cfg.reward.cost))
    metrics["arms"] = arms
    embedding = embedding_spec(sig, int(X.shape[1]))
    save_checkpoint(out / "policy.pt", result, arms=arms, embedding=embedding, alpha=alpha,
                    config=OmegaConf.to_container(cfg, resolve=True),
                    training_queries=[r["fingerprint"] for r in rows if r.get("fingerprint")])
    write_csv(pd.DataFrame(result.history), out / "history.csv")

    table = pd.DataFrame([{"choice": name, "val_reward": metrics[key]} for name, key in
                          [("policy", "policy"), ("oracle (best arm per query)", "oracle"),
                           (f"best single arm ({metrics['best_single_arm']})", "best_single"),
                           ("random arm", "random")]])
    sp = metrics["speedup_replayed"]
    if sp:
        table["speedup_replayed"] = [sp["policy"], sp["oracle"], sp.get(metrics["best_single_arm"]), sp["random"]]
        single = pd.DataFrame([{"choice": f"always {a}", "speedup_replayed": sp[a]} for a in arms])
        table = pd.concat([table, single], ignore_index=True)
    notes = (f"{metrics['n_val']} validation queries ({metrics['n_train']} for training; the validation set also "
             f"picked the epoch, {metrics['best_epoch']}); reward source {cfg.reward.source}, alpha {alpha}, cost "
             f"{cfg.reward.cost}; policy shares: " + ", ".join(f"{a} {s:.2f}" for a, s in metrics["share"].items()) +
             ". speedup_replayed: total autoregressive seconds / total seconds of the chosen arms' measured "
             "speculative runs (collect.measure_speculative) on the validation queries.")
    if metrics["proxy_vs_measured"]:
        pc = metrics["proxy_vs_measured"]
        notes += (f" Proxy vs measured speed over {pc['queries']} queries: mean Spearman {pc['spearman']:.3f}, "
                  f"top-1 agreement {pc['top1_agreement']:.3f}.")
    md = write_tables(table, out, stem="summary", title="specbench train-policy", notes=notes)

    sweeps = {}
    if cfg.sweep.get("alpha"):
        sweeps["alpha"] = alpha_sweep(rows, X, arms, cfg, [float(a) for a in cfg.sweep.alpha], out)
    if cfg.sweep.get("n_examples"):
        sweeps["n_examples"] = data_efficiency(rows, X, arms, cfg, alpha, [int(n) for n in cfg.sweep.n_examples], out)
    atomic_write_text(out / "metrics.json", json.dumps({**metrics, "sweeps": sweeps}, indent=2, default=float))
    print_table(md, title=f"train-policy ({out}; policy.pt, metrics.json, history.csv)")
    print(notes)
    return out


def alpha_sweep(rows, X, arms, cfg, alphas: list[float], out: Path) -> list[dict]:
    """Chosen-arm shares, validation reward and replayed speedup as alpha sweeps (one policy per alpha)."""
    table = []
    for a in alphas:
        result, chosen = fit(rows, X, arms, cfg, a)
        sp = replay(rows, result.val_idx, arms, chosen)
        table.append({"alpha": a, "val_reward": result.metrics["policy"], "speedup_replayed": sp.get("policy"),
                      **{f"share_{arm}": s for arm, s in result.metrics["share"].items()}})
    df = pd.DataFrame(table)
    write_tables(df, out, stem="alpha_sweep", title="alpha trade-off",
                 notes="One policy per alpha (same seed and split). share_<arm>: share of validation queries "
                       "given that arm; speedup_replayed as in summary.md.")
    _plot_alpha(df, arms, out / "alpha_sweep.png")
    return table


def data_efficiency(rows, X, arms, cfg, alpha: float, sizes: list[int], out: Path) -> list[dict]:
    table = []
    for n in sizes:
        result, chosen = fit(rows, X, arms, cfg, alpha, n_examples=n)
        sp = replay(rows, result.val_idx, arms, chosen)
        table.append({"n_examples": result.metrics["n_train"], "val_reward": result.metrics["policy"],
                      "oracle_reward": result.metrics["oracle"], "speedup_replayed": sp.get("policy"),
                      "oracle_speedup": sp.get("oracle")})
    df = pd.DataFrame(table)
    write_tables(df, out, stem="data_efficiency", title="data efficiency",
                 notes="One policy per training-set size (same validation queries).")
    _plot_data_efficiency(df, out / "data_efficiency.png")
    return table


def _pyplot(path: Path):
    """matplotlib's pyplot (Agg backend), or None with a warning when matplotlib is missing."""
    try:
        return pyplot()
    except ImportError:
        log.warning("matplotlib is not installed: %s skipped (pip install matplotlib)", path.name)
        return None


def _plot_alpha(df: pd.DataFrame, arms: list[str], path: Path) -> None:
    plt = _pyplot(path)
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm in arms:
        ax.plot(df.alpha, df[f"share_{arm}"], marker="o", label=f"share {arm}")
    ax.set_xlabel("alpha (1: alignment only, 0: cost only)")
    ax.set_ylabel("share of validation queries")
    if df.speedup_replayed.notna().any():
        ax2 = ax.twinx()
        ax2.plot(df.alpha, df.speedup_replayed, "k--", marker="s", label="speedup (replayed)")
        ax2.set_ylabel("speedup over autoregressive")
        ax2.legend(loc="upper right", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_data_efficiency(df: pd.DataFrame, path: Path) -> None:
    plt = _pyplot(path)
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    use_speed = df.speedup_replayed.notna().any()
    y, ref = ("speedup_replayed", "oracle_speedup") if use_speed else ("val_reward", "oracle_reward")
    ax.plot(df.n_examples, df[y], marker="o", label="policy")
    ax.plot(df.n_examples, df[ref], "k:", label="oracle")
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(list(df.n_examples), [str(int(n)) for n in df.n_examples])
    ax.set_xlabel("training queries")
    ax.set_ylabel("speedup over autoregressive (replayed)" if use_speed else "validation reward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
