"""The cost profile's outputs (``specbench profile``): ``profile.json`` / ``.csv`` / ``.md``, the verification-cost
plot, and, from an eval run's rounds, the best draft length per drafter (``best_k.csv`` / ``.md``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from specbench import profiling
from specbench.errors import SpecbenchError
from specbench.files import atomic_write_text
from specbench.pipelines import tables
from specbench.records import CONFIG, ROUNDS, read_jsonl

log = logging.getLogger(__name__)

COLUMNS = ["kind", "name", "context", "q", "seconds", "relative"]
NOTES = (
    "Relative cost: the target's forward over q new tokens (the last committed token + q - 1 draft tokens) "
    "over its one-token step at the same context (step_ms), median of the repeats. A round drafting k tokens "
    "verifies q = k + 1. Drafters: seconds per drafted token in a steady-state round (catch-up of one "
    "committed token + the draft), c_draft = that over the one-token step at the smallest context."
)
BEST_NOTES = (
    "predicted_speedup = (E[accepted(k)] + 1) / (c_verify(k + 1) + k * c_draft), in one-token steps of "
    "the smallest context (autoregressive = 1). E[accepted(k)] = mean of min(accepted, k) over the eval "
    "run's full rounds at draft length K (drafted == n_max == K); beyond K (extrapolated) a geometric tail "
    "with alpha = sum(accepted) / sum(positions at risk) over all the drafter's rounds. Switching and "
    "catch-up after other arms are not counted."
)


def profile_rows(prof: Mapping) -> pd.DataFrame:
    """``profile.csv``: one row per target point (kind target, q new tokens) and per drafter (q: tokens drafted)."""
    rows = [
        {"kind": "target", "name": prof["target"], "context": c, "q": q, "seconds": s, "relative": rel}
        for c in prof["contexts"]
        for q, s, rel in zip(prof["q"], prof["seconds"][str(c)], prof["c_verify"][str(c)])
    ]
    rows += [
        {
            "kind": "drafter",
            "name": name,
            "context": prof["draft_context"],
            "q": prof["draft_tokens"],
            "seconds": d["seconds_per_token"],
            "relative": d["c_draft"],
        }
        for name, d in prof["drafters"].items()
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def verify_table(prof: Mapping) -> pd.DataFrame:
    """Rows: contexts; columns: ``context``, ``step_ms`` (the one-token step), then one per ``q`` (relative cost)."""
    return pd.DataFrame(
        [
            {
                "context": str(c),
                "step_ms": 1000 * prof["step_seconds"][str(c)],
                **{f"q={q}": rel for q, rel in zip(prof["q"], prof["c_verify"][str(c)])},
            }
            for c in prof["contexts"]
        ]
    )


def drafter_table(prof: Mapping) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "drafter": name,
                "kind": d["kind"],
                "ms_per_token": 1000 * d["seconds_per_token"],
                "c_draft": d["c_draft"],
                "drafted": f"{d['drafted']:g}",
            }
            for name, d in prof["drafters"].items()
        ],
        columns=["drafter", "kind", "ms_per_token", "c_draft", "drafted"],
    )


def tree_table(prof: Mapping) -> pd.DataFrame | None:
    """Rows: contexts; columns: one per tree shape ``BxD`` (B disjoint drafts of D tokens), its cost relative to
    the one-token step, with the chain of the same node count beside it where the profile measured one."""
    trees = prof.get("trees")
    if not trees:
        return None
    rows = []
    for c in prof["contexts"]:
        chain = dict(zip(prof["q"], prof["c_verify"][str(c)]))
        row = {"context": str(c)}
        for t in trees[str(c)]:
            row[f"tree {t['branches']}x{t['depth']} ({t['nodes']} nodes)"] = t["c_verify"]
            row[f"chain q={t['nodes'] + 1}"] = chain.get(t["nodes"] + 1, float("nan"))
        rows.append(row)
    return pd.DataFrame(rows)


def profile_markdown(prof: Mapping) -> tuple[str, str]:
    """The verification-cost table and the drafter table, as Markdown."""
    return tables.to_markdown(verify_table(prof)), tables.to_markdown(drafter_table(prof), floatfmt=".4f")


def rounding_text(prof: Mapping) -> str | None:
    """The rounding section of profile.md (the tie tolerance's calibration), or None without one."""
    r = prof.get("rounding")
    if not r:
        return None
    return (
        f"Largest |logit difference| between one-token steps and {r['chunk']}-token forwards over the same "
        f"tokens: {r['max_abs']:.3g} (mean per-row maximum {r['mean_abs']:.3g}; {r['prompts']} prompts x "
        f"{r['new_tokens']} tokens; argmax agreed at {r['argmax_agree']} of {r['positions']} positions; largest "
        f"|logit| {r['max_logit']:.3g}). The tie tolerance of {prof['dtype']} for this target: set "
        f"target.tie_tolerance.{prof['dtype']} to at least {r['max_abs']:.3g} (decoding/certify.py)."
    )


def write_profile(out: Path, prof: dict) -> None:
    atomic_write_text(out / profiling.PROFILE_FILE, json.dumps(prof, indent=2) + "\n")
    tables.write_csv(profile_rows(prof), out / profiling.PROFILE_CSV)
    verify_md, drafter_md = profile_markdown(prof)
    head = (
        f"# Cost profile: {prof['target']} ({prof['dtype']}, {prof['device']} {prof['device_name']}, "
        f"{prof['threads']} threads, torch {prof['torch']})"
    )
    drafters_title = f"Drafters (context {prof['draft_context']}, {prof['draft_tokens']} tokens per draft)"
    rounding = rounding_text(prof)
    trees = tree_table(prof)
    trees_md = tables.to_markdown(trees) if trees is not None else None
    trees_title = "Token trees: one forward with the tree mask, relative to the one-token step (chain of as many tokens beside)"
    atomic_write_text(
        out / "profile.md",
        f"{head}\n\n## Verification cost relative to the one-token step\n\n{verify_md}\n\n"
        + (f"## {trees_title}\n\n{trees_md}\n\n" if trees_md else "")
        + f"## {drafters_title}\n\n{drafter_md}\n\n{NOTES}\n"
        + (f"\n## Rounding (the tie tolerance)\n\n{rounding}\n" if rounding else ""),
    )
    if trees_md:
        tables.print_table(trees_md, title=trees_title)
    tables.print_table(
        verify_md,
        title=f"Verification cost relative to the one-token step ({prof['dtype']}, "
        f"{prof['device']}, {prof['threads']} threads)",
    )
    tables.print_table(drafter_md, title=drafters_title)
    if rounding:
        tables.print_table(rounding, title="Rounding (the tie tolerance)")
    plot_verify(prof, out / "verify_cost.png")


def plot_verify(prof: Mapping, path: Path) -> None:
    try:
        plt = tables.pyplot()
    except ImportError:
        log.warning("matplotlib is not installed: %s not drawn", path.name)
        return
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for c in prof["contexts"]:
        ax.plot(
            prof["q"],
            prof["c_verify"][str(c)],
            marker="o",
            label=f"context {c} (step {1000 * prof['step_seconds'][str(c)]:.1f} ms)",
        )
    ax.set_xlabel("new tokens per forward (q)")
    ax.set_ylabel("time / one-token step")
    ax.set_title(
        f"{Path(str(prof['target'])).name} {prof['dtype']} {prof['device']}, {prof['threads']} threads",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- best draft length ----------------------------------------------------------------------------


def rounds_of(run_dir, cfg=None) -> list[dict]:
    """The ``rounds.jsonl`` records of an eval run directory; with ``cfg`` (the profile's config) the run must be of
    the same target, dtype and device, greedy and lossless (its acceptance is combined with this profile's costs)."""
    path = Path(str(run_dir)).expanduser() / ROUNDS
    if not path.is_file():
        raise SpecbenchError(
            f"profile.run={run_dir}: no rounds.jsonl there",
            "point profile.run at a `specbench eval` run directory (with fixed:<drafter> methods)",
        )
    if cfg is not None:
        check_same_setting(Path(str(run_dir)).expanduser(), cfg)
    return list(read_jsonl(path))


def check_same_setting(run_dir: Path, cfg) -> None:
    """Refuse an eval run whose acceptance does not belong with this profile's costs: another target, dtype or device,
    a sampling run, or a lossy cascade (issue 34: it was combined without a word)."""
    from omegaconf import OmegaConf

    from specbench.models.devices import dtype_name

    saved = run_dir / CONFIG
    if not saved.is_file():
        raise SpecbenchError(
            f"profile.run={run_dir}: no config.yaml there, so its target and decoding are unknown",
            "point profile.run at a `specbench eval` run directory (it writes config.yaml)",
        )
    there = OmegaConf.load(saved)
    sel = lambda c, key: OmegaConf.select(c, key, default=None)  # noqa: E731
    why = []
    if str(sel(there, "target.model")) != str(sel(cfg, "target.model")):
        why.append(f"target.model {sel(there, 'target.model')} (here {sel(cfg, 'target.model')})")
    mine = dtype_name(sel(cfg, "target.dtype"), sel(cfg, "target.device"))
    theirs = dtype_name(sel(there, "target.dtype"), sel(there, "target.device"))
    if mine != theirs:
        why.append(f"target.dtype {theirs} (here {mine})")
    if str(sel(there, "target.device")) != str(sel(cfg, "target.device")):
        why.append(f"target.device {sel(there, 'target.device')} (here {sel(cfg, 'target.device')})")
    temperature = sel(there, "decoding.temperature") or 0
    if float(temperature) > 0:
        why.append(
            f"decoding.temperature={temperature} (sampled acceptance; the draft-length model is greedy's)"
        )
    rule = sel(there, "cascade.rule")
    if rule not in (None, "none"):
        why.append(f"cascade.rule={rule} (a lossy rule accepts more than verification does)")
    if why:
        raise SpecbenchError(
            f"profile.run={run_dir} was run with " + "; ".join(why) + ": its acceptance does not "
            "belong with this profile's costs",
            "evaluate this target greedily and losslessly (specbench eval decoding=greedy cascade=none "
            "methods=[autoregressive,fixed:*] with this target and dtype) and pass that run",
        )


def best_k_tables(prof: Mapping, rounds: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(summary, curve)``: per drafter its best draft length; per (drafter, k) the prediction."""
    context = str(prof["draft_context"])
    c_verify = dict(zip(prof["q"], prof["c_verify"][context]))
    summary, curve = [], []
    for name, d in prof["drafters"].items():
        acc = profiling.acceptance_of(profiling.drafter_rounds(rounds, name))
        if acc is None:
            log.warning("best draft length: the eval run has no full round of fixed:%s: skipped", name)
            continue
        rows = profiling.best_draft_length(acc, c_verify, d["c_draft"])
        curve += [{"drafter": name, **r} for r in rows]
        best = next((r for r in rows if r["best"]), None)
        summary.append(
            {
                "drafter": name,
                "rounds": acc.rounds,
                "full_rounds": len(acc.counts),
                "K": acc.K,
                "alpha": acc.alpha,
                "c_draft": d["c_draft"],
                "best_k": best["k"] if best else None,
                "predicted_speedup": best["predicted_speedup"] if best else None,
                "extrapolated": best["extrapolated"] if best else None,
            }
        )
    if not summary:
        raise SpecbenchError(
            f"the eval run has no rounds of fixed:<drafter> for the drafters profiled here "
            f"({', '.join(prof['drafters']) or 'none'})",
            "evaluate the same pool with `specbench eval methods=[autoregressive,fixed:*]` and "
            "pass that run directory as profile.run",
        )
    return pd.DataFrame(summary), pd.DataFrame(curve)


def write_best_k(out: Path, prof: Mapping, rounds: list[dict], run_dir: Path) -> None:
    summary, curve = best_k_tables(prof, rounds)
    if not any(k + 1 in prof["q"] for k in profiling.DRAFT_LENGTHS):
        log.warning("profile.q has no q = k + 1 for a draft length k in 1..16: no best draft length")
    tables.write_csv(curve, out / "best_k.csv")
    md = tables.to_markdown(summary)
    atomic_write_text(
        out / "best_k.md",
        f"# Best draft length per drafter (eval run {run_dir})\n\n{md}\n\n"
        f"## Predicted speedup per draft length\n\n{tables.to_markdown(curve)}\n\n"
        f"{BEST_NOTES}\n",
        encoding="utf-8",
    )
    tables.print_table(md, title=f"Best draft length per drafter (rounds of {run_dir})")
