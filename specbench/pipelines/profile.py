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

import logging
import platform
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import torch
from omegaconf import DictConfig

from specbench import profiling
from specbench.decoding import certify
from specbench.decoding.drafter import DecodeContext, Drafter
from specbench.decoding.sampling import SamplingParams
from specbench.errors import SpecbenchError
from specbench.models import Target, load_model
from specbench.pipelines.profile_tables import rounds_of, write_best_k, write_profile
from specbench.pipelines.session.prompting import CONTEXT_KEYS, Context
from specbench.pipelines.session.run_dir import RunFiles, start_run
from specbench.pipelines.session.schedule import rotation
from specbench.tasks import Prompter, load_dataset_config, load_shots, truncate_fields
from specbench.timing import Clock
from specbench.validate import COUNT, PATH, Rule, integer, list_of, nested, nonempty_list_of, text


@dataclass(frozen=True, kw_only=True)
class Rounding:
    """profile.rounding.*: how the bf16/fp32 rounding gap (the tie tolerance) is measured."""

    prompts: Annotated[int, integer(0)]
    new_tokens: Annotated[int, COUNT]
    chunk: Annotated[int, integer(2)]


# the shape of the value; tree_shapes names a pair whose numbers are below 1
TREES = Rule(
    lambda v: isinstance(v, list) and all(list_of(integer()).ok(p) and len(p) == 2 for p in v),
    "a list of [branches, depth] pairs of integers",
    null=True,
    note=" (tree shapes whose verify cost is measured, e.g. [[2,5],[3,8]])",
)


@dataclass(frozen=True, kw_only=True)
class ProfileSettings:
    """profile.* (conf/profile.yaml holds the defaults)."""

    q: Annotated[list[int], nonempty_list_of(integer(1), note=" (new tokens per target forward)")]
    contexts: Annotated[list[int], nonempty_list_of(integer(1), note=" (context lengths in tokens)")]
    repeats: Annotated[int, COUNT]
    warmup: Annotated[int, integer(0)]
    trees: Annotated[list[list[int]] | None, TREES]
    draft_tokens: Annotated[int, COUNT]
    tokens: Annotated[str, text()]  # a name of TOKENS
    run: Annotated[str | None, PATH]
    rounding: Annotated[Rounding, nested(Rounding)]


SECTIONS: dict[str, tuple[type, ...]] = {"profile": (ProfileSettings,)}

log = logging.getLogger(__name__)

FILES = RunFiles(results=(profiling.PROFILE_FILE, profiling.PROFILE_CSV))
TOKENS = ("prompt", "random")


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    p = cfg.profile
    qs, contexts, tokens_from = checked_points(p)
    repeats, warmup, k = int(p.repeats), int(p.get("warmup", 2)), int(p.get("draft_tokens", 8))
    shapes = tree_shapes(p.get("trees"))
    out = start_run(cfg, output_dir, FILES, sections=SECTIONS)
    eval_rounds = rounds_of(p.run, cfg) if p.get("run") else None  # a wrong directory fails before measuring

    from specbench.drafters import build_pool

    log.info("loading target %s", cfg.target.model)
    loaded = load_model(cfg.target.model, dtype=cfg.target.dtype, device=cfg.target.device)
    target = Target(loaded)
    pool = build_pool(target, cfg.pool.get("drafters"), measuring=True)
    drafters = {name: d for name, d in pool.items() if d.drafts}
    extra = max(max(qs), k + 1, *(b * d + 1 for b, d in shapes))
    check_fits(target, cfg, contexts[-1], extra)
    source = context_source(cfg, target, loaded, tokens_from, contexts[-1] + extra)
    clock = Clock(target.device)
    dec = cfg.decoding
    sampling = SamplingParams(
        temperature=float(dec.temperature), top_k=int(dec.top_k), top_p=float(dec.top_p)
    )
    rng = torch.Generator(device=target.device).manual_seed(int(cfg.seed))

    verify = {c: measure_verify(target, source, c, qs, repeats, warmup, clock) for c in contexts}
    trees = (
        {c: measure_trees(target, source, c, shapes, repeats, warmup, clock) for c in contexts}
        if shapes and not target.is_encoder_decoder
        else {}
    )
    drafted = measure_drafters(
        target, drafters, source[: contexts[0]], k, sampling, rng, Readings(repeats, warmup, clock)
    )
    for (
        name,
        d,
    ) in drafted.items():  # the kind: the drafter module its config builds with (quantized, eagle, ...)
        builder = str(cfg.pool.drafters[name].get("_target_") or d["kind"])
        d["kind"] = builder.removeprefix("specbench.drafters.").removesuffix(".build")
    prof = profile_dict(target, qs, contexts, verify, drafted, k, repeats, tokens_from)
    if trees:
        prof["trees"] = tree_rows(trees, shapes, verify, contexts)
    rounding = measure_rounding(cfg, target, loaded)
    if rounding is not None:
        prof["rounding"] = rounding
    write_profile(out, prof)
    if eval_rounds is not None:
        write_best_k(out, prof, eval_rounds, Path(p.run))
    return out


def checked_points(p) -> tuple[list[int], list[int], str]:
    """``profile``'s forward sizes (1 always), context lengths (at least one) and token source, checked."""
    qs = sorted({1, *(int(q) for q in p.q)})
    contexts = sorted({int(c) for c in p.contexts})
    if not contexts:
        raise SpecbenchError(
            "profile.contexts is empty", "list at least one context length, e.g. profile.contexts=[128]"
        )
    tokens_from = str(p.get("tokens", "prompt"))
    if tokens_from not in TOKENS:
        raise SpecbenchError(f"profile.tokens={tokens_from}: unknown", f"use one of: {', '.join(TOKENS)}")
    return qs, contexts, tokens_from


def tree_rows(trees: dict, shapes, verify: dict, contexts: list[int]) -> dict:
    """``profile.json``'s ``trees``: per context, each shape's seconds and its cost relative to the one-token step."""
    return {
        str(c): [
            {"branches": b, "depth": d, "nodes": b * d, "seconds": t, "c_verify": t / verify[c][0]}
            for (b, d), t in zip(shapes, trees[c])
        ]
        for c in contexts
    }


# -- measuring ------------------------------------------------------------------------------------


def check_fits(target: Target, cfg: DictConfig, longest: int, extra: int) -> None:
    """Refuse contexts that with their new tokens overrun the target's positions."""
    ctx = Context.of(
        target.config,
        cfg.target.get("context_keys", CONTEXT_KEYS),
        str(cfg.target.model),
        cfg.target.get("context_limit"),
    )
    need = longest if target.is_encoder_decoder else longest + extra - 1
    if ctx.limit is not None and need > ctx.limit:
        raise SpecbenchError(
            f"profile.contexts: a context of {longest:,} tokens with {extra} new tokens needs "
            f"{need:,} positions, more than the {ctx.limit:,} of {ctx.model} ({ctx.key} in its "
            "model config)",
            "lower profile.contexts (or profile.q / profile.draft_tokens)",
        )


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
        raise SpecbenchError(
            "the dataset has no queries to build a context from", "use profile.tokens=random"
        )
    if cfg.target.prompt.templates not in cfg.templates:
        raise SpecbenchError(
            f"unknown template set '{cfg.target.prompt.templates}'",
            f"set target.prompt.templates to one of: {', '.join(cfg.templates)}",
        )
    shots = load_shots(cfg.dataset, int(cfg.dataset.get("n_shot") or 0))
    prompter = Prompter(
        loaded.tokenizer,
        cfg.target.prompt.style,
        cfg.templates[cfg.target.prompt.templates],
        cfg.target.prompt.get("system"),
        shots,
        cfg.target.prompt.get("chat_template"),
    )
    return [
        prompter(truncate_fields(q, loaded.tokenizer, cfg.dataset.get("max_input_tokens")))
        for q in queries[:n]
    ]


def measure_rounding(cfg: DictConfig, target: Target, loaded) -> dict | None:
    """The tie tolerance's calibration (``certify.calibrate``) on the dataset's first prompts:
    ``profile.rounding.prompts`` prompts (0: skipped), ``new_tokens`` greedy steps each, compared with
    ``chunk``-token forwards over the same tokens."""
    r = cfg.profile.get("rounding") or {}
    n = int(r.get("prompts", 0) or 0)
    if n <= 0:
        return None
    cal = certify.calibrate(
        target,
        dataset_prompts(cfg, loaded, n),
        new_tokens=int(r.get("new_tokens", 48)),
        chunk=int(r.get("chunk", 5)),
    )
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


def measure_verify(
    target: Target, source: list[int], context: int, qs: list[int], repeats: int, warmup: int, clock: Clock
) -> list[float]:
    """Median seconds of ``target.score`` over ``q`` new tokens after a ``context``-token prefill, per ``q``."""
    follow = source[context:]
    return time_forwards(
        target,
        source[:context],
        [lambda q=q: target.score(follow[: q - 1]) for q in qs],
        repeats,
        warmup,
        clock,
    )


def time_forwards(
    target: Target,
    context: list[int],
    forwards: list[Callable[[], object]],
    repeats: int,
    warmup: int,
    clock: Clock,
) -> list[float]:
    """Median seconds of each target forward of ``forwards`` after a prefill of ``context``, the cache cropped back
    to the context around each call (interleaved repeats, ``warmup`` untimed)."""
    target.prefill(context)
    keep = len(target.tokens) - 1  # the cached positions: every committed token but the last

    def timed(i: int) -> float:
        target.lm.crop(keep)
        t0 = clock.boundary()
        forwards[i]()
        t1 = clock.boundary()
        target.lm.crop(keep)
        return t1 - t0

    return [statistics.median(x) for x in interleaved(len(forwards), repeats, warmup, timed)]


def tree_shapes(spec) -> list[tuple[int, int]]:
    """``profile.trees``: ``[[branches, depth], ...]`` -> shapes (each a whole number >= 1)."""
    shapes = []
    for item in list(spec or []):
        pair = list(item) if not isinstance(item, (str, int)) else []
        if len(pair) != 2 or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in pair):
            raise SpecbenchError(
                f"profile.trees: {item!r} is not a [branches, depth] pair of whole numbers >= 1",
                "write e.g. profile.trees=[[2,5],[3,8]] (2 drafts of 5 tokens, 3 of 8)",
            )
        shapes.append((pair[0], pair[1]))
    return shapes


def measure_trees(
    target: Target,
    source: list[int],
    context: int,
    shapes: list[tuple[int, int]],
    repeats: int,
    warmup: int,
    clock: Clock,
) -> list[float]:
    """Median seconds of ``target.score_tree`` over a tree of ``branches`` disjoint drafts of ``depth`` tokens
    (``branches * depth`` nodes, each branch starting with a different token) after a ``context``-token prefill:
    the cost of verifying several drafters' drafts in one forward with the tree mask."""
    from specbench.decoding.tree import build_tree

    follow = source[context:]
    trees = [
        build_tree(
            {f"d{b}": [(follow[i] + b) % target.vocab_size for i in range(depth)] for b in range(branches)}
        )
        for branches, depth in shapes
    ]
    return time_forwards(
        target, source[:context], [lambda t=t: target.score_tree(t) for t in trees], repeats, warmup, clock
    )


@dataclass(frozen=True)
class Readings:
    """How each timing is taken: ``repeats`` readings after ``warmup`` untimed ones, between ``clock`` boundaries."""

    repeats: int
    warmup: int
    clock: Clock


def measure_drafters(
    target: Target,
    drafters: Mapping[str, Drafter],
    context: list[int],
    k: int,
    sampling: SamplingParams,
    rng: torch.Generator,
    readings: Readings,
) -> dict[str, dict]:
    """Per drafter: median seconds per drafted token of a steady-state round and the median tokens drafted."""
    repeats, warmup, clock = readings.repeats, readings.warmup, readings.clock
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
    return {
        name: {
            "kind": type(drafters[name]).__name__,
            "seconds_per_token": statistics.median(readings[i]),
            "drafted": statistics.median(counts[i][warmup:]),
        }
        for i, name in enumerate(names)
    }


# -- outputs --------------------------------------------------------------------------------------


def profile_dict(
    target: Target,
    qs: list[int],
    contexts: list[int],
    verify: dict[int, list[float]],
    drafted: dict[str, dict],
    k: int,
    repeats: int,
    tokens_from: str,
) -> dict:
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
        "drafters": {
            name: {**d, "c_draft": d["seconds_per_token"] / step[contexts[0]]} for name, d in drafted.items()
        },
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
