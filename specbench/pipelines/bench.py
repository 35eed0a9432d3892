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

import contextlib
import copy
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import replace
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
from specbench.models.attention import stock_attention
from specbench.pipelines import speed, tables
from specbench.pipelines.session.core import Session
from specbench.pipelines.session.run_dir import RunFiles
from specbench.pipelines.session.schedule import rotation
from specbench.records import BENCH, JsonlWriter, read_jsonl
from specbench.selection import Fixed

log = logging.getLogger(__name__)

OURS, HF = "ours", "hf"
GREEDY = SamplingParams(temperature=0.0)
COLUMNS = [
    "method",
    "n_examples",
    "ours_tokens",
    "hf_tokens",
    "ours_s",
    "hf_s",
    "ours_speedup",
    "hf_speedup",
    "ours_vs_hf",
    "ours_mat",
    "match_rate",
    "ours_speedup_mean",
    "hf_speedup_mean",
]
NOTES = (
    "ours_s / hf_s: total seconds of our decode loop / of Hugging Face generate. ours_speedup = ours "
    "autoregressive s per new token / ours method s per new token; hf_speedup = the same for HF greedy over HF "
    "assisted; ours_vs_hf = HF s per token / ours s per token for the same method (>1: ours is faster); ratios are of totals over the examples both sides ran "
    "(*_mean: mean of per-example ratios). ours_mat = new tokens per target forward (bonus token included). "
    "match_rate = share of examples whose output ids equal HF's. Greedy, batch size 1, same prompts, "
    "max_new_tokens, EOS ids and draft length; HF assistant settings pinned (num_assistant_tokens = draft "
    "length, constant schedule, confidence threshold 0). NaN hf columns: HF cannot run that drafter."
)


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
    for key, value in dict(
        do_sample=False,
        num_beams=1,
        temperature=None,
        top_k=None,
        top_p=None,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        bad_words_ids=None,
        suppress_tokens=None,
        begin_suppress_tokens=None,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        min_length=0,
        min_new_tokens=None,
        eos_token_id=sorted(eos_ids),
        pad_token_id=pad_id,
    ).items():
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


class Ours:
    """Our decode loop, greedy, on one arm (``autoregressive`` or a drafter), seeded as the run."""

    impl = OURS

    def __init__(self, method: str, session: Session, draft_length: int):
        self.method, self.session, self.draft_length = method, session, draft_length

    def setup(self, prompt: list[int], n: int, query) -> Callable[[], tuple[list[int], int | None]]:
        s = self.session
        selector, rng = s.fixed(self.method), s.rng(seed=int(s.cfg.seed))
        spec = replace(
            s.spec, sampling=GREEDY, limits=Limits(max_new_tokens=n, draft_length=self.draft_length)
        )

        def go():
            gen = s.decode(selector, prompt, rng, spec, query=query)
            return gen.tokens, gen.target_calls

        return go

    def attention(self):
        return contextlib.nullcontext()


class HuggingFace:
    """Hugging Face ``generate`` on the target: plain greedy, or assisted by a drafter's counterpart
    (``fields``: generation config fields, ``kwargs``: generate arguments; see ``hf_assistance``)."""

    impl = HF

    def __init__(self, method: str, target, config, lengths: Iterable[int], kwargs: dict | None = None):
        self.method, self.target, self.kwargs = method, target, kwargs or {}
        self.configs = {}  # one per max_new_tokens (warm-up and timed), built before any timing
        for n in set(lengths):
            self.configs[n] = copy.deepcopy(config)
            self.configs[n].max_new_tokens = n

    @classmethod
    def assisted(
        cls,
        method: str,
        target,
        base_config,
        draft_length: int,
        lengths: Iterable[int],
        assistance: tuple[dict, dict],
    ) -> HuggingFace:
        fields, kwargs = assistance
        config = pinned_assistant_settings(base_config, draft_length)
        for key, value in fields.items():
            setattr(config, key, value)
        return cls(method, target, config, lengths, kwargs)

    def setup(self, prompt: list[int], n: int, query) -> Callable[[], tuple[list[int], int | None]]:
        target = self.target
        ids = torch.tensor([prompt], device=target.device)
        mask = torch.ones_like(ids)
        first = 1 if target.is_encoder_decoder else len(prompt)  # after the decoder start token / the prompt

        def go():
            seq = target.model.generate(
                input_ids=ids, attention_mask=mask, generation_config=self.configs[n], **self.kwargs
            )
            # at most n, as ours (transformers 4.46 prompt lookup on encoder-decoder models emits n + 1)
            return seq[0, first : first + n].tolist(), None

        return go

    def attention(self):
        """transformers' own attention for the target and an assistant model (ours packs grouped-query heads)."""
        stack = contextlib.ExitStack()
        for model in (self.target.model, self.kwargs.get("assistant_model")):
            if model is not None:
                stack.enter_context(stock_attention(model))
        return stack


class Attempts:
    """Runs variants timed. HF refusing a drafter it does not support marks it ``unsupported`` (NaN hf columns,
    the reason in the notes); any other failure stops the bench (see ``hf_unsupported``)."""

    def __init__(self, clock, eos_ids: frozenset[int]):
        self.clock, self.eos_ids = clock, eos_ids
        self.unsupported: dict[str, str] = {}  # method -> HF's reason
        self.ran: set[tuple[str, str]] = set()  # (method, impl) of the variants that generated at least once

    def skipped(self, v) -> bool:
        return v.impl == HF and v.method in self.unsupported

    def __call__(self, v, prompt: list[int], n: int, query) -> tuple[list[int], int | None, float] | None:
        go = v.setup(prompt, n, query)
        try:
            with (
                v.attention()
            ):  # HF runs the attention transformers ships (switched outside the timed region)
                t0 = self.clock.boundary()
                ids, calls = go()
                seconds = self.clock.boundary() - t0
        except Exception as exc:  # noqa: BLE001 - sorted below: unsupported, or an error
            if v.impl == OURS:
                raise
            self.refused(v, query, exc)
            return None
        self.ran.add((v.method, v.impl))
        return cut_at_eos(ids, self.eos_ids), calls, seconds

    def refused(self, v, query, exc: Exception) -> None:
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if v.method == AUTOREGRESSIVE or not hf_unsupported(exc) or (v.method, v.impl) in self.ran:
            raise SpecbenchError(
                f"Hugging Face generate ({v.method}) failed on query {query.id}: {reason}",
                "this is not HF refusing an unsupported drafter, so it is not marked unsupported: fix the cause "
                "(out of memory: a smaller model, a lower decoding.max_new_tokens, or another device) and rerun "
                "into the same directory (finished generations are kept)",
            ) from exc
        log.warning(
            "Hugging Face assisted generation does not support drafter '%s' (%s): hf columns are NaN",
            v.method,
            reason,
        )
        self.unsupported[v.method] = reason


def variants_of(s: Session, names: list[str], draft_length: int) -> list:
    """Ours and Hugging Face's autoregressive runs, then per drafter ours and (where HF has a counterpart) HF's
    assisted generation with that drafter at its own draft length."""
    dec, eos_ids, tok = s.cfg.decoding, s.eos_ids, s.loaded.tokenizer
    lengths = (int(dec.max_new_tokens), int(s.cfg.warmup.max_new_tokens))
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else min(eos_ids)
    base = hf_generation_config(s.target.model, eos_ids, pad_id)
    variants: list = [
        Ours(AUTOREGRESSIVE, s, draft_length),
        HuggingFace(AUTOREGRESSIVE, s.target, base, lengths),
    ]
    for name in names:
        k = int(
            s.pool[name].draft_length or draft_length
        )  # pool.drafters.<name>.draft_length, else the run's
        variants.append(Ours(name, s, draft_length))
        assist = hf_assistance(s.pool[name], k)
        if assist is None:
            log.warning(
                "drafter '%s' (%s) has no Hugging Face assisted-generation counterpart: hf columns are NaN",
                name,
                type(s.pool[name]).__name__,
            )
        else:
            variants.append(HuggingFace.assisted(name, s.target, base, k, lengths, assist))
    return variants


def drafter_names(s: Session, asked) -> list[str]:
    """The drafters to bench: ``drafters`` (pool names, ``*``: every drafter), or every drafter of the pool."""
    drafters = [a for a in s.pool if a != AUTOREGRESSIVE]
    if asked is None:
        return drafters
    names = []
    for name in (str(a) for a in asked):
        for a in drafters if name == "*" else [name]:
            Fixed(list(s.pool), a)  # an unknown name is refused with the pool's names
            if a == AUTOREGRESSIVE:
                continue
            names.append(a)
    return list(dict.fromkeys(names))


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    dec = cfg.decoding
    if float(dec.temperature) != 0:
        raise SpecbenchError(
            f"bench compares greedy outputs token for token; got decoding.temperature={dec.temperature}",
            "use decoding=greedy (the default)",
        )
    s = Session.open(cfg, output_dir, RunFiles(results=(BENCH,)), "bench")
    k, max_new, warm_n = int(dec.draft_length), int(dec.max_new_tokens), int(cfg.warmup.max_new_tokens)
    names = drafter_names(s, cfg.get("drafters"))
    variants = variants_of(s, names, k)
    attempt = Attempts(s.clock, s.eos_ids)
    prompts = [s.prompter(q) for q in s.queries]
    path = s.out / BENCH
    done = {(r["query_id"], r["method"], r["impl"]) for r in read_jsonl(path)}
    todo = [(q, v) for q in s.queries for v in variants if (q.id, v.method, v.impl) not in done]
    if todo and warm_n > 0:
        for v in variants:
            attempt(v, prompts[0], warm_n, s.queries[0])
    with JsonlWriter(path) as writer, tqdm(total=len(todo), desc="bench", unit="gen") as bar:
        for qi, query in enumerate(s.queries):
            for v in (variants[vi] for vi in rotation(len(variants), qi)):
                if (query.id, v.method, v.impl) in done:
                    continue
                result = None if attempt.skipped(v) else attempt(v, prompts[qi], max_new, query)
                if result is not None:
                    ids, calls, seconds = result
                    writer.write(
                        {
                            "query_id": query.id,
                            "task": query.task,
                            "method": v.method,
                            "impl": v.impl,
                            "output_ids": ids,
                            "new_tokens": len(ids),
                            "seconds": seconds,
                            "target_calls": calls,
                        }
                    )
                bar.update(1)
    table = summarize(read_jsonl(path), order=[AUTOREGRESSIVE, *names])
    title = f"specbench bench: {cfg.target.model} in {cfg.target.dtype} (draft length {k}, max_new_tokens {max_new})"
    why = "".join(f" HF does not support {m} here ({r})." for m, r in attempt.unsupported.items())
    md = tables.write_tables(table, s.out, stem="bench", title=title, notes=NOTES + why)
    tables.print_table(md, title=f"bench ({s.out})")
    return s.out


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
        return speed.speedup(
            [b["seconds"] for b, _ in p],
            [m["seconds"] for _, m in p],
            [b["new_tokens"] for b, _ in p],
            [m["new_tokens"] for _, m in p],
        )

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
        rows.append(
            {
                "method": m,
                "n_examples": n,
                "ours_tokens": total(m, OURS, "new_tokens"),
                "hf_tokens": total(m, HF, "new_tokens"),
                "ours_s": total(m, OURS, "seconds"),
                "hf_s": total(m, HF, "seconds"),
                "ours_speedup": ours_speedup,
                "hf_speedup": hf_speedup,
                "ours_vs_hf": speedup((m, HF), (m, OURS))[0],
                "ours_mat": speed.mat(total(m, OURS, "new_tokens"), calls) if not math.isnan(calls) else nan,
                "match_rate": sum(a["output_ids"] == b["output_ids"] for a, b in same) / len(same)
                if same
                else nan,
                "ours_speedup_mean": ours_mean,
                "hf_speedup_mean": hf_mean,
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)
