"""``specbench profile``: the cost profile of a target and its drafter pool, in one run.

In the run's dtype, device and thread count (``target.dtype``, ``target.device``, ``threads``):

- the target: for each context length of ``profile.contexts`` the context is prefilled once (every
  context token but the last in the cache, as after a committed round), then ``target.score(draft)``
  over ``q - 1`` draft tokens (the last committed token + the draft: ``q`` new tokens) is timed for each
  ``q`` of ``profile.q`` (1 is always added), the cache cropped back to the context after each call.
  Repeats are interleaved (each repeat times every ``q`` once, in an order rotated by the repeat) and the
  first ``profile.warmup`` repeats are not recorded; a point's time is the median of ``profile.repeats``.
  ``c_verify(q) = t(q) / t(1)`` at that context. Encoder-decoder targets: the context is the encoder
  input (the decoder holds its start token).
- each drafter of the pool (the autoregressive arm has nothing to draft), at the smallest context: it is
  synced to the context through the loop's protocol (a ``DecodeContext``, holding the target's prefill states
  for drafters that declare ``state_layers``, then ``sync``; that first, per-query sync is not timed),
  then a steady-state round is timed: ``sync`` (the catch-up of the last committed token) and
  ``propose`` of ``profile.draft_tokens`` tokens (EOS does not end the draft), divided by the tokens
  drafted (at least 1); interleaved and warmed up as above. ``c_draft = seconds per token / t(1)``.

The context is the first query's prompt (``profile.tokens: prompt``), repeated until it is long enough,
or seeded random token ids of the vocabulary (``random``). Each reading is one ``Clock.boundary`` pair
(a device synchronisation at both ends on CUDA).

Written to the run directory: ``profile.csv`` (one row per measurement), ``profile.md`` (relative costs:
contexts by q, then the drafters), ``profile.json`` (machine-readable, read by ``cost: measured``:
``specbench.profiling``) and ``verify_cost.png``. With ``profile.run=<an eval run directory>`` also
``best_k.csv`` / ``best_k.md``: for each drafter whose ``fixed:<name>`` method that run decoded, the draft
length the profile and its acceptance predict to be fastest (``profiling.best_draft_length``).
"""

from __future__ import annotations

import json
import logging
import platform
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig

from specbench import profiling
from specbench.decoding import certify
from specbench.decoding.drafter import Drafter, DecodeContext
from specbench.decoding.sampling import SamplingParams
from specbench.errors import SpecbenchError
from specbench.models import Target, load_model
from specbench.pipelines import tables
from specbench.pipelines.prompting import CONTEXT_KEYS, Context
from specbench.tasks import Prompter
from specbench.pipelines.run_dir import RunFiles, start_run
from specbench.pipelines.schedule import rotation
from specbench.records import atomic_write_text, read_jsonl
from specbench.tasks import load_dataset_config, load_shots, truncate_fields
from specbench.timing import Clock

log = logging.getLogger(__name__)

FILES = RunFiles(results=("profile.json", "profile.csv"))
TOKENS = ("prompt", "random")
COLUMNS = ["kind", "name", "context", "q", "seconds", "relative"]
NOTES = ("Relative cost: the target's forward over q new tokens (the last committed token + q - 1 draft tokens) "
         "over its one-token step at the same context (step_ms), median of the repeats. A round drafting k tokens "
         "verifies q = k + 1. Drafters: seconds per drafted token in a steady-state round (catch-up of one "
         "committed token + the draft), c_draft = that over the one-token step at the smallest context.")
BEST_NOTES = ("predicted_speedup = (E[accepted(k)] + 1) / (c_verify(k + 1) + k * c_draft), in one-token steps of "
              "the smallest context (autoregressive = 1). E[accepted(k)] = mean of min(accepted, k) over the eval "
              "run's full rounds at draft length K (drafted == n_max == K); beyond K (extrapolated) a geometric tail "
              "with alpha = sum(accepted) / sum(positions at risk) over all the drafter's rounds. Switching and "
              "catch-up after other arms are not counted.")


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    p = cfg.profile
    qs = sorted({1, *(int(q) for q in p.q)})
    contexts = sorted({int(c) for c in p.contexts})
    if not contexts:
        raise SpecbenchError("profile.contexts is empty",
                             "list at least one context length, e.g. profile.contexts=[128]")
    tokens_from = str(p.get("tokens", "prompt"))
    if tokens_from not in TOKENS:
        raise SpecbenchError(f"profile.tokens={tokens_from}: unknown", f"use one of: {', '.join(TOKENS)}")
    repeats, warmup, k = int(p.repeats), int(p.get("warmup", 2)), int(p.get("draft_tokens", 8))
    out = start_run(cfg, output_dir, FILES)
    eval_rounds = rounds_of(p.run) if p.get("run") else None  # a wrong directory fails before any measuring

    from specbench.drafters import build_pool

    log.info("loading target %s", cfg.target.model)
    loaded = load_model(cfg.target.model, dtype=cfg.target.dtype, device=cfg.target.device)
    target = Target(loaded)
    pool = build_pool(target, cfg.pool.get("drafters"), measuring=True)
    drafters = {name: d for name, d in pool.items() if d.drafts}
    extra = max(max(qs), k + 1)
    check_fits(target, cfg, contexts[-1], extra)
    source = context_source(cfg, target, loaded, tokens_from, contexts[-1] + extra)
    clock = Clock(target.device)
    dec = cfg.decoding
    sampling = SamplingParams(temperature=float(dec.temperature), top_k=int(dec.top_k), top_p=float(dec.top_p))
    rng = torch.Generator(device=target.device).manual_seed(int(cfg.seed))

    verify = {c: measure_verify(target, source, c, qs, repeats, warmup, clock) for c in contexts}
    drafted = measure_drafters(target, drafters, source[:contexts[0]], k, sampling, rng, repeats, warmup, clock)
    for name, d in drafted.items():  # the kind: the drafter module its config builds with (quantized, eagle, ...)
        builder = str(cfg.pool.drafters[name].get("_target_") or d["kind"])
        d["kind"] = builder.removeprefix("specbench.drafters.").removesuffix(".build")
    prof = profile_dict(target, qs, contexts, verify, drafted, k, repeats, tokens_from)
    rounding = measure_rounding(cfg, target, loaded)
    if rounding is not None:
        prof["rounding"] = rounding
    write_profile(out, prof)
    if eval_rounds is not None:
        write_best_k(out, prof, eval_rounds, Path(p.run))
    return out


# -- measuring ------------------------------------------------------------------------------------

def check_fits(target: Target, cfg: DictConfig, longest: int, extra: int) -> None:
    """Refuse contexts that with their new tokens overrun the target's positions."""
    ctx = Context.of(target.config, cfg.target.get("context_keys", CONTEXT_KEYS), str(cfg.target.model))
    need = longest if target.is_encoder_decoder else longest + extra - 1
    if ctx.limit is not None and need > ctx.limit:
        raise SpecbenchError(f"profile.contexts: a context of {longest:,} tokens with {extra} new tokens needs "
                             f"{need:,} positions, more than the {ctx.limit:,} of {ctx.model} ({ctx.key} in its "
                             "model config)",
                             "lower profile.contexts (or profile.q / profile.draft_tokens)")


def context_source(cfg: DictConfig, target: Target, loaded, tokens_from: str, length: int) -> list[int]:
    """``length`` token ids to build contexts and drafts from: the first query's prompt repeated, or random ids."""
    if tokens_from == "random":
        gen = torch.Generator().manual_seed(int(cfg.seed))
        return torch.randint(0, target.vocab_size, (length,), generator=gen).tolist()
    return repeat_to(dataset_prompts(cfg, loaded, 1)[0], length)


def dataset_prompts(cfg: DictConfig, loaded, n: int) -> list[list[int]]:
    """The prompt ids of the dataset's first ``n`` queries, built as eval builds them."""
    queries = load_dataset_config(cfg.dataset)
    if not queries:
        raise SpecbenchError("the dataset has no queries to build a context from", "use profile.tokens=random")
    if cfg.target.prompt.templates not in cfg.templates:
        raise SpecbenchError(f"unknown template set '{cfg.target.prompt.templates}'",
                             f"set target.prompt.templates to one of: {', '.join(cfg.templates)}")
    shots = load_shots(cfg.dataset, int(cfg.dataset.get("n_shot") or 0))
    prompter = Prompter(loaded.tokenizer, cfg.target.prompt.style, cfg.templates[cfg.target.prompt.templates],
                        cfg.target.prompt.get("system"), shots, cfg.target.prompt.get("chat_template"))
    return [prompter(truncate_fields(q, loaded.tokenizer, cfg.dataset.get("max_input_tokens"))) for q in queries[:n]]


def measure_rounding(cfg: DictConfig, target: Target, loaded) -> dict | None:
    """The tie tolerance's calibration (``certify.calibrate``) on the dataset's first prompts:
    ``profile.rounding.prompts`` prompts (0: skipped), ``new_tokens`` greedy steps each, compared with
    ``chunk``-token forwards over the same tokens."""
    r = cfg.profile.get("rounding") or {}
    n = int(r.get("prompts", 0) or 0)
    if n <= 0:
        return None
    cal = certify.calibrate(target, dataset_prompts(cfg, loaded, n), new_tokens=int(r.get("new_tokens", 48)),
                            chunk=int(r.get("chunk", 5)))
    return cal


def repeat_to(ids: Sequence[int], length: int) -> list[int]:
    """``ids`` repeated and cut to ``length`` tokens."""
    if not ids:
        raise SpecbenchError("the first query's prompt has no tokens", "use profile.tokens=random")
    return (list(ids) * (length // len(ids) + 1))[:length]


def interleaved(n: int, repeats: int, warmup: int, timed: Callable[[int], float]) -> list[list[float]]:
    """``timed(i)`` for each of ``n`` points in each of ``warmup + repeats`` repeats (order rotated by the
    repeat); the readings of the last ``repeats`` per point."""
    readings: list[list[float]] = [[] for _ in range(n)]
    for r in range(warmup + repeats):
        for i in rotation(n, r):
            t = timed(i)
            if r >= warmup:
                readings[i].append(t)
    return readings


def measure_verify(target: Target, source: list[int], context: int, qs: list[int], repeats: int, warmup: int,
                   clock: Clock) -> list[float]:
    """Median seconds of ``target.score`` over ``q`` new tokens after a ``context``-token prefill, per ``q``."""
    target.prefill(source[:context])
    keep = len(target.tokens) - 1  # the cached positions: every committed token but the last
    follow = source[context:]

    def timed(i: int) -> float:
        draft = follow[: qs[i] - 1]
        target.lm.crop(keep)
        t0 = clock.boundary()
        target.score(draft)
        t1 = clock.boundary()
        target.lm.crop(keep)
        return t1 - t0

    return [statistics.median(x) for x in interleaved(len(qs), repeats, warmup, timed)]


def measure_drafters(target: Target, drafters: Mapping[str, Drafter], context: list[int], k: int,
                     sampling: SamplingParams, rng: torch.Generator, repeats: int, warmup: int,
                     clock: Clock) -> dict[str, dict]:
    """Per drafter: median seconds per drafted token of a steady-state round and the median tokens drafted."""
    if not drafters:
        return {}
    layers = tuple(sorted({layer for d in drafters.values() for layer in d.state_layers(False)}))
    query = DecodeContext(encoder_ids=None, side_observations=False)
    states = target.prefill(context, layers=layers).states
    if layers:
        query.record_states(states, rows=len(target.tokens) - 1, start=0)
    query.encoder_ids, query.encoder_outputs = target.encoder_ids, target.encoder_outputs
    committed = list(target.tokens)
    names = list(drafters)
    for d in drafters.values():
        d.sync(query, committed)  # the per-query setup (a prefill of the context): not timed
    counts: list[list[int]] = [[] for _ in names]

    def timed(i: int) -> float:
        d = drafters[names[i]]
        t0 = clock.boundary()
        d.sync(query, committed)
        draft = d.propose(committed, k, sampling, rng, frozenset())
        t1 = clock.boundary()
        counts[i].append(len(draft.tokens))
        return (t1 - t0) / max(len(draft.tokens), 1)

    readings = interleaved(len(names), repeats, warmup, timed)
    return {name: {"kind": type(drafters[name]).__name__, "seconds_per_token": statistics.median(readings[i]),
                   "drafted": statistics.median(counts[i][warmup:])}
            for i, name in enumerate(names)}


# -- outputs --------------------------------------------------------------------------------------

def profile_dict(target: Target, qs: list[int], contexts: list[int], verify: dict[int, list[float]],
                 drafted: dict[str, dict], k: int, repeats: int, tokens_from: str) -> dict:
    """The content of ``profile.json``."""
    step = {c: verify[c][0] for c in contexts}
    device = target.device
    return {
        "format": profiling.FORMAT,
        **profiling.identity(target),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "tokens": tokens_from,
        "repeats": repeats,
        "q": qs,
        "contexts": contexts,
        "step_seconds": {str(c): step[c] for c in contexts},
        "seconds": {str(c): verify[c] for c in contexts},
        "c_verify": {str(c): profiling.relative(verify[c]) for c in contexts},
        "draft_context": contexts[0],
        "draft_tokens": k,
        "drafters": {name: {**d, "c_draft": d["seconds_per_token"] / step[contexts[0]]} for name, d in drafted.items()},
    }


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def profile_rows(prof: Mapping) -> pd.DataFrame:
    """``profile.csv``: one row per target point (kind target, q new tokens) and per drafter (q: tokens drafted)."""
    rows = [{"kind": "target", "name": prof["target"], "context": c, "q": q, "seconds": s, "relative": rel}
            for c in prof["contexts"]
            for q, s, rel in zip(prof["q"], prof["seconds"][str(c)], prof["c_verify"][str(c)])]
    rows += [{"kind": "drafter", "name": name, "context": prof["draft_context"], "q": prof["draft_tokens"],
              "seconds": d["seconds_per_token"], "relative": d["c_draft"]} for name, d in prof["drafters"].items()]
    return pd.DataFrame(rows, columns=COLUMNS)


def verify_table(prof: Mapping) -> pd.DataFrame:
    """Rows: contexts; columns: ``context``, ``step_ms`` (the one-token step), then one per ``q`` (relative cost)."""
    return pd.DataFrame([{"context": str(c), "step_ms": 1000 * prof["step_seconds"][str(c)],
                          **{f"q={q}": rel for q, rel in zip(prof["q"], prof["c_verify"][str(c)])}}
                         for c in prof["contexts"]])


def drafter_table(prof: Mapping) -> pd.DataFrame:
    return pd.DataFrame([{"drafter": name, "kind": d["kind"], "ms_per_token": 1000 * d["seconds_per_token"],
                          "c_draft": d["c_draft"], "drafted": f"{d['drafted']:g}"}
                         for name, d in prof["drafters"].items()],
                        columns=["drafter", "kind", "ms_per_token", "c_draft", "drafted"])


def profile_markdown(prof: Mapping) -> tuple[str, str]:
    """The verification-cost table and the drafter table, as Markdown."""
    return tables.to_markdown(verify_table(prof)), tables.to_markdown(drafter_table(prof), floatfmt=".4f")


def rounding_text(prof: Mapping) -> str | None:
    """The rounding section of profile.md (the tie tolerance's calibration), or None without one."""
    r = prof.get("rounding")
    if not r:
        return None
    return (f"Largest |logit difference| between one-token steps and {r['chunk']}-token forwards over the same "
            f"tokens: {r['max_abs']:.3g} (mean per-row maximum {r['mean_abs']:.3g}; {r['prompts']} prompts x "
            f"{r['new_tokens']} tokens; argmax agreed at {r['argmax_agree']} of {r['positions']} positions; largest "
            f"|logit| {r['max_logit']:.3g}). The tie tolerance of {prof['dtype']} for this target: set "
            f"target.tie_tolerance.{prof['dtype']} to at least {r['max_abs']:.3g} (decoding/certify.py).")


def write_profile(out: Path, prof: dict) -> None:
    atomic_write_text(out / profiling.PROFILE_FILE, json.dumps(prof, indent=2) + "\n")
    tables.write_csv(profile_rows(prof), out / "profile.csv")
    verify_md, drafter_md = profile_markdown(prof)
    head = (f"# Cost profile: {prof['target']} ({prof['dtype']}, {prof['device']} {prof['device_name']}, "
            f"{prof['threads']} threads, torch {prof['torch']})")
    drafters_title = f"Drafters (context {prof['draft_context']}, {prof['draft_tokens']} tokens per draft)"
    rounding = rounding_text(prof)
    atomic_write_text(out / "profile.md", f"{head}\n\n## Verification cost relative to the one-token step\n\n{verify_md}\n\n"
                                          f"## {drafters_title}\n\n{drafter_md}\n\n{NOTES}\n"
                                          + (f"\n## Rounding (the tie tolerance)\n\n{rounding}\n" if rounding else ""))
    tables.print_table(verify_md, title=f"Verification cost relative to the one-token step ({prof['dtype']}, "
                                        f"{prof['device']}, {prof['threads']} threads)")
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
        ax.plot(prof["q"], prof["c_verify"][str(c)], marker="o",
                label=f"context {c} (step {1000 * prof['step_seconds'][str(c)]:.1f} ms)")
    ax.set_xlabel("new tokens per forward (q)")
    ax.set_ylabel("time / one-token step")
    ax.set_title(f"{Path(str(prof['target'])).name} {prof['dtype']} {prof['device']}, {prof['threads']} threads",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- best draft length ----------------------------------------------------------------------------

def rounds_of(run_dir) -> list[dict]:
    """The ``rounds.jsonl`` records of an eval run directory."""
    path = Path(str(run_dir)).expanduser() / "rounds.jsonl"
    if not path.is_file():
        raise SpecbenchError(f"profile.run={run_dir}: no rounds.jsonl there",
                             "point profile.run at a `specbench eval` run directory (with fixed:<drafter> methods)")
    return list(read_jsonl(path))


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
        summary.append({"drafter": name, "rounds": acc.rounds, "full_rounds": len(acc.counts), "K": acc.K,
                        "alpha": acc.alpha, "c_draft": d["c_draft"], "best_k": best["k"] if best else None,
                        "predicted_speedup": best["predicted_speedup"] if best else None,
                        "extrapolated": best["extrapolated"] if best else None})
    if not summary:
        raise SpecbenchError(f"the eval run has no rounds of fixed:<drafter> for the drafters profiled here "
                             f"({', '.join(prof['drafters']) or 'none'})",
                             "evaluate the same pool with `specbench eval methods=[autoregressive,fixed:*]` and "
                             "pass that run directory as profile.run")
    return pd.DataFrame(summary), pd.DataFrame(curve)


def write_best_k(out: Path, prof: Mapping, rounds: list[dict], run_dir: Path) -> None:
    summary, curve = best_k_tables(prof, rounds)
    if not any(k + 1 in prof["q"] for k in profiling.DRAFT_LENGTHS):
        log.warning("profile.q has no q = k + 1 for a draft length k in 1..16: no best draft length")
    tables.write_csv(curve, out / "best_k.csv")
    md = tables.to_markdown(summary)
    atomic_write_text(out / "best_k.md", f"# Best draft length per drafter (eval run {run_dir})\n\n{md}\n\n"
                                   f"## Predicted speedup per draft length\n\n{tables.to_markdown(curve)}\n\n"
                                   f"{BEST_NOTES}\n", encoding="utf-8")
    tables.print_table(md, title=f"Best draft length per drafter (rounds of {run_dir})")
