"""``specbench bench``: our decode loop against Hugging Face ``generate``, on the same examples.

Per example, in one process, in an order rotated by the example index (as in ``eval``), every
variant generates once, greedily, at batch size 1, from the same prompt ids (built as ``eval``
builds them) with the same ``max_new_tokens``, EOS ids, pad id and draft length:

- ``ours`` / autoregressive: ``decode`` with ``Fixed`` on the ``autoregressive`` arm;
- ``hf`` / autoregressive: ``model.generate(do_sample=False)`` (plain greedy);
- ``ours`` / <drafter>: ``decode`` with ``Fixed(<drafter>)``;
- ``hf`` / <drafter>: assisted generation with the same drafter: its torch module as
  ``assistant_model`` (model drafters), or ``prompt_lookup_num_tokens=draft_length`` with
  ``max_matching_ngram_size=max_ngram`` (prompt lookup); the assistant settings are pinned on
  copies of the generation configs: ``num_assistant_tokens=draft_length``,
  ``num_assistant_tokens_schedule="constant"``, ``assistant_confidence_threshold=0``.

What is timed: one call (``decode(...)`` or ``generate(...)``, input tensor included) between two
readings of ``specbench.timing.Clock``; loading, prompt building and the first, untimed, short
warm-up generation of each variant are not. New tokens are counted the same way for both: the ids
after the prompt (after the decoder start token for encoder-decoder models), cut after the first
EOS (kept). A drafter Hugging Face has no counterpart for, or refuses as unsupported
(``hf_unsupported``), gets NaN in the ``hf`` columns, a logged warning and its reason in the notes;
any other Hugging Face failure (out of memory included) stops the run with an error. One JSONL line
per generation is appended to ``bench.jsonl`` as it finishes (rerunning into the same directory
skips finished generations); the table is a pure function of it.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from specbench.arms import AUTOREGRESSIVE
from specbench.decoding.loop import Limits
from specbench.decoding.sampling import SamplingParams
from specbench.drafters import ModelDrafter
from specbench.drafters.prompt_lookup import PromptLookup
from specbench.errors import SpecbenchError
from specbench.pipelines import tables, speed
from specbench.pipelines.methods import parse_methods
from specbench.pipelines.run_dir import RunFiles
from specbench.pipelines.session import Session
from specbench.pipelines.schedule import rotation
from specbench.records import JsonlWriter, read_jsonl

log = logging.getLogger(__name__)

OURS, HF = "ours", "hf"
GREEDY = SamplingParams(temperature=0.0)
COLUMNS = ["method", "n_examples", "ours_tokens", "hf_tokens", "ours_s", "hf_s", "ours_speedup", "hf_speedup",
           "ours_vs_hf", "ours_mat", "match_rate", "ours_speedup_mean", "hf_speedup_mean"]
NOTES = ("ours_s / hf_s: total seconds of our decode loop / of Hugging Face generate. ours_speedup = ours "
         "autoregressive s per new token / ours method s per new token; hf_speedup = the same for HF greedy over HF "
         "assisted; ours_vs_hf = HF s per token / ours s per token for the same method (>1: ours is faster); ratios are of totals over the examples both sides ran "
         "(*_mean: mean of per-example ratios). ours_mat = new tokens per target forward (bonus token included). "
         "match_rate = share of examples whose output ids equal HF's. Greedy, batch size 1, same prompts, "
         "max_new_tokens, EOS ids and draft length; HF assistant settings pinned (num_assistant_tokens = draft "
         "length, constant schedule, confidence threshold 0). NaN hf columns: HF cannot run that drafter.")


@dataclass
class Variant:
    """One way of generating. ``setup(prompt_ids, max_new_tokens, query)`` builds everything a call
    needs (selector, limits, generator, input tensor) and returns ``go() -> (new ids, target calls |
    None)``: only ``go`` is timed."""

    method: str  # "autoregressive" or a drafter name: the table row
    impl: str  # OURS or HF
    setup: Callable[[list[int], int, object], Callable[[], tuple[list[int], int | None]]]


def cut_at_eos(ids: list[int], eos_ids: frozenset[int]) -> list[int]:
    """The ids up to and including the first EOS."""
    for i, tok in enumerate(ids):
        if tok in eos_ids:
            return ids[: i + 1]
    return ids


def pinned_assistant_settings(config, draft_length: int):
    """A copy of a generation config with the assistant knobs fixed (their defaults vary by version)."""
    config = copy.deepcopy(config)
    config.num_assistant_tokens = draft_length
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0
    return config


def hf_generation_config(model, eos_ids: frozenset[int], pad_id: int):
    """The model's generation config with plain greedy settings and nothing that changes argmax outputs."""
    config = copy.deepcopy(model.generation_config)
    for key, value in dict(do_sample=False, num_beams=1, temperature=None, top_k=None, top_p=None,
                           repetition_penalty=1.0, no_repeat_ngram_size=0, bad_words_ids=None, suppress_tokens=None,
                           begin_suppress_tokens=None, forced_bos_token_id=None, forced_eos_token_id=None,
                           min_length=0, min_new_tokens=None, eos_token_id=sorted(eos_ids),
                           pad_token_id=pad_id).items():
        setattr(config, key, value)
    return config


def hf_assistance(drafter, draft_length: int) -> tuple[dict, dict] | None:
    """``(generation config fields, generate kwargs)`` that make HF assisted generation use ``drafter``,
    or None when HF has no counterpart. A model drafter's module gets a pinned copy of its generation
    config (HF reads the assistant knobs from the assistant's config; ours never reads it)."""
    if isinstance(drafter, PromptLookup):
        return {"prompt_lookup_num_tokens": draft_length, "max_matching_ngram_size": drafter.max_ngram}, {}
    if isinstance(drafter, ModelDrafter):
        module = drafter.lm.model
        module.generation_config = pinned_assistant_settings(module.generation_config, draft_length)
        return {}, {"assistant_model": module}
    return None


def hf_unsupported(exc: BaseException) -> bool:
    """Whether a failure of HF ``generate`` is HF refusing a combination it does not support: its
    argument checks raise ``ValueError`` / ``NotImplementedError`` (e.g. "assisted generation is not
    supported with stateful models"). Anything else (out of memory, a runtime error in a kernel) is a
    failure of the run, not a property of the drafter."""
    return isinstance(exc, (ValueError, NotImplementedError))


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    dec = cfg.decoding
    if float(dec.temperature) != 0:
        raise SpecbenchError(f"bench compares greedy outputs token for token; got decoding.temperature={dec.temperature}",
                             "use decoding=greedy (the default)")
    s = Session.open(cfg, output_dir, RunFiles(results=("bench.jsonl",)), "bench")
    out, target, clock, eos_ids = s.out, s.target, s.clock, s.eos_ids
    k, max_new, warm_n = int(dec.draft_length), int(dec.max_new_tokens), int(cfg.warmup.max_new_tokens)
    names = [AUTOREGRESSIVE, *(m.name.split(":", 1)[1] for m in parse_methods(
        ["fixed:*"] if cfg.get("drafters") is None else [f"fixed:{d}" for d in cfg.drafters], s.pool, None)[1:])]
    pad_id = s.loaded.tokenizer.pad_token_id if s.loaded.tokenizer.pad_token_id is not None else min(eos_ids)
    prompts = [s.prompter(q) for q in s.queries]
    base_config = hf_generation_config(target.model, eos_ids, pad_id)

    def ours(arm: str) -> Variant:
        def setup(prompt, n, query):
            selector, limits, rng = s.fixed(arm), Limits(max_new_tokens=n, draft_length=k), s.rng(seed=int(cfg.seed))

            def go():
                gen = s.decode(selector, prompt, rng, limits=limits, query=query, sampling=GREEDY)
                return gen.tokens, gen.target_calls
            return go
        return Variant(arm, OURS, setup)

    def k_of(name: str) -> int:  # a drafter's own draft length (pool.drafters.<name>.draft_length), else the run's
        return int(s.pool[name].draft_length or k)

    def hf(method: str, fields: dict, kwargs: dict) -> Variant:
        config = base_config if method == AUTOREGRESSIVE else pinned_assistant_settings(base_config, k_of(method))
        for key, value in fields.items():
            setattr(config, key, value)
        configs = {}  # one per max_new_tokens (warm-up and timed), built before any timing
        for n in {max_new, warm_n}:
            configs[n] = copy.deepcopy(config)
            configs[n].max_new_tokens = n
        start = 1 if target.is_encoder_decoder else None  # decoder start token / prompt

        def setup(prompt, n, query):
            ids = torch.tensor([prompt], device=target.device)
            mask = torch.ones_like(ids)
            first = start if start is not None else len(prompt)

            def go():
                seq = target.model.generate(input_ids=ids, attention_mask=mask, generation_config=configs[n], **kwargs)
                # at most n, as ours (transformers 4.46 prompt lookup on encoder-decoder models emits n + 1)
                return seq[0, first:first + n].tolist(), None
            return go
        return Variant(method, HF, setup)

    variants = [ours(AUTOREGRESSIVE), hf(AUTOREGRESSIVE, {}, {})]
    for name in names[1:]:
        variants.append(ours(name))
        assist = hf_assistance(s.pool[name], k_of(name))
        if assist is None:
            log.warning("drafter '%s' (%s) has no Hugging Face assisted-generation counterpart: hf columns are NaN",
                        name, type(s.pool[name]).__name__)
        else:
            variants.append(hf(name, *assist))

    unsupported: dict[str, str] = {}  # method -> HF's reason
    ran: set[tuple[str, str]] = set()  # (method, impl) of the variants that generated at least once

    def attempt(v: Variant, prompt, n, query):
        """Run ``v`` timed. HF refusing a drafter it does not support marks it unsupported (NaN hf
        columns, the reason in the notes); any other failure stops the bench (see ``hf_unsupported``)."""
        go = v.setup(prompt, n, query)
        try:
            t0 = clock.boundary()
            ids, calls = go()
            seconds = clock.boundary() - t0
        except Exception as exc:  # noqa: BLE001 - sorted below: unsupported, or an error
            if v.impl == OURS:
                raise
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if v.method == AUTOREGRESSIVE or not hf_unsupported(exc) or (v.method, v.impl) in ran:
                raise SpecbenchError(
                    f"Hugging Face generate ({v.method}) failed on query {query.id}: {reason}",
                    "this is not HF refusing an unsupported drafter, so it is not marked unsupported: fix the cause "
                    "(out of memory: a smaller model, a lower decoding.max_new_tokens, or another device) and rerun "
                    "into the same directory (finished generations are kept)") from exc
            log.warning("Hugging Face assisted generation does not support drafter '%s' (%s): hf columns are NaN",
                        v.method, reason)
            unsupported[v.method] = reason
            return None
        ran.add((v.method, v.impl))
        return cut_at_eos(ids, eos_ids), calls, seconds

    path = out / "bench.jsonl"
    done = {(r["query_id"], r["method"], r["impl"]) for r in read_jsonl(path)}
    todo = [(q, v) for q in s.queries for v in variants if (q.id, v.method, v.impl) not in done]
    if todo and warm_n > 0:
        for v in variants:
            attempt(v, prompts[0], warm_n, s.queries[0])

    with JsonlWriter(path) as writer, tqdm(total=len(todo), desc="bench", unit="gen") as bar:
        for qi, query in enumerate(s.queries):
            for vi in rotation(len(variants), qi):
                v = variants[vi]
                if (query.id, v.method, v.impl) in done:
                    continue
                if not (v.impl == HF and v.method in unsupported):
                    result = attempt(v, prompts[qi], max_new, query)
                    if result is not None:
                        ids, calls, seconds = result
                        writer.write({"query_id": query.id, "task": query.task, "method": v.method, "impl": v.impl,
                                      "output_ids": ids, "new_tokens": len(ids), "seconds": seconds,
                                      "target_calls": calls})
                bar.update(1)

    table = summarize(read_jsonl(path), order=names)
    title = f"specbench bench: {cfg.target.model} in {cfg.target.dtype} (draft length {k}, max_new_tokens {max_new})"
    why = "".join(f" HF does not support {m} here ({r})." for m, r in unsupported.items())
    md = tables.write_tables(table, out, stem="bench", title=title, notes=NOTES + why)
    tables.print_table(md, title=f"bench ({out})")
    return out


def summarize(records: Iterable[dict], order: list[str] | None = None) -> pd.DataFrame:
    """One row per method (autoregressive first) from the ``bench.jsonl`` records (see ``NOTES``)."""
    gens = {(r["method"], r["impl"], r["query_id"]): r for r in records}
    if not gens:
        return pd.DataFrame(columns=COLUMNS)
    methods = list(dict.fromkeys([AUTOREGRESSIVE, *(order or []), *(m for m, _, _ in gens)]))
    queries = list(dict.fromkeys(q for _, _, q in gens))
    nan = float("nan")

    def pairs(a: tuple[str, str], b: tuple[str, str]) -> list[tuple[dict, dict]]:
        return [(gens[(*a, q)], gens[(*b, q)]) for q in queries if (*a, q) in gens and (*b, q) in gens]

    def speedup(base, method) -> tuple[float, float]:
        """(total, mean of per-example) ratios of seconds per new token over the examples both ran."""
        p = pairs(base, method)
        return speed.speedup([b["seconds"] for b, _ in p], [m["seconds"] for _, m in p],
                             [b["new_tokens"] for b, _ in p], [m["new_tokens"] for _, m in p])

    def total(method, impl, key) -> float:
        vals = [g[key] for (m, i, _), g in gens.items() if m == method and i == impl]
        return sum(vals) if vals else nan

    rows = []
    for m in methods:
        n = sum(1 for (mm, i, _) in gens if mm == m and i == OURS)
        if not n and m != AUTOREGRESSIVE:
            continue
        ours_speedup, ours_mean = speedup((AUTOREGRESSIVE, OURS), (m, OURS))
        hf_speedup, hf_mean = speedup((AUTOREGRESSIVE, HF), (m, HF))
        same = pairs((m, OURS), (m, HF))
        calls = total(m, OURS, "target_calls")
        rows.append({
            "method": m, "n_examples": n, "ours_tokens": total(m, OURS, "new_tokens"),
            "hf_tokens": total(m, HF, "new_tokens"), "ours_s": total(m, OURS, "seconds"), "hf_s": total(m, HF, "seconds"),
            "ours_speedup": ours_speedup, "hf_speedup": hf_speedup, "ours_vs_hf": speedup((m, HF), (m, OURS))[0],
            "ours_mat": speed.mat(total(m, OURS, "new_tokens"), calls) if not math.isnan(calls) else nan,
            "match_rate": sum(a["output_ids"] == b["output_ids"] for a, b in same) / len(same) if same else nan,
            "ours_speedup_mean": ours_mean, "hf_speedup_mean": hf_mean,
        })
    return pd.DataFrame(rows, columns=COLUMNS)
