"""The target's own greedy answers to training prompts, generated in batches (bf16 where the target runs in it)
and cached in ``$SPECBENCH_CACHE/responses/`` keyed by the prompt's token ids, shared by every train-drafter
run on one target, dtype and vocabulary, appended as each batch finishes (resumable)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specbench.drafters.head_files import vocab_fingerprint
from specbench.models import Target
from specbench.models.store import cache_dir
from specbench.records import JsonlWriter, read_jsonl
from specbench.tasks import Prompter


def response_cache(target: Target) -> Path:
    """The target's greedy training answers, shared by every train-drafter run on this target and dtype
    (``$SPECBENCH_CACHE/responses/``): a generalist trained on the specialists' rows generates nothing new."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(target.loaded.name))
    dtype = str(target.model.dtype).removeprefix("torch.")
    return cache_dir() / "responses" / f"{name}-{dtype}-{vocab_fingerprint(target.tokenizer)}.jsonl"


def response_key(prompt: list[int]) -> str:
    return hashlib.sha256(json.dumps(prompt).encode()).hexdigest()[:20]


def cached_answer(record: dict, max_new: int) -> list[int] | None:
    """A cached greedy answer cut to ``max_new`` tokens, when it answers that request: generated with at
    least ``max_new`` new tokens, or finished (EOS) before its own limit; else None."""
    ids, made = record["ids"], int(record["max_new"])
    return ids[:max_new] if made >= max_new or len(ids) < made else None


def target_responses(
    target: Target, prompter: Prompter, queries, path: Path, max_new: int, eos, batch_size: int = 32
) -> dict:
    """The target's greedy answer per query (``max_new`` tokens at most, cut after EOS), keyed by the
    prompt's token ids in the shared cache ``path`` (:func:`response_cache`; a longer cached answer serves a
    shorter request, its greedy prefix: :func:`cached_answer`), appended
    as each batch finishes (resumable; rows another run generated are reused). Batched Hugging Face
    ``generate`` with left padding, the prompts sorted by length (little padding): these are training
    texts, not timed outputs (in bf16 a row's rounding may depend on its batch)."""
    known: dict[str, dict] = {}
    for r in read_jsonl(path):  # the longest answer per prompt
        if "key" in r and int(r["max_new"]) >= int(known.get(r["key"], {}).get("max_new", -1)):
            known[r["key"]] = r
    prompts = {q.id: prompter(q) for q in queries}
    keys = {q.id: response_key(prompts[q.id]) for q in queries}
    done = {}
    for q in queries:
        hit = cached_answer(known[keys[q.id]], max_new) if keys[q.id] in known else None
        if hit is not None:
            done[q.id] = hit
    todo = sorted((q for q in queries if q.id not in done), key=lambda q: len(prompts[q.id]))
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    with JsonlWriter(path) as writer, tqdm(total=len(todo), desc="target responses", unit="query") as bar:
        for s in range(0, len(todo), batch_size):
            chunk = todo[s : s + batch_size]
            batch = [prompts[q.id] for q in chunk]
            width = max(len(p) for p in batch)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=target.device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=target.device)
            with torch.inference_mode():
                seq = target.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=max_new,
                    do_sample=False,
                    eos_token_id=sorted(eos),
                    pad_token_id=pad,
                )
            skip = 1 if target.is_encoder_decoder else width  # decoder start token / the prompt
            for q, row in zip(chunk, seq[:, skip:].tolist()):
                cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
                writer.write({"key": keys[q.id], "max_new": int(max_new), "query_id": q.id, "ids": row[:cut]})
                done[q.id] = row[:cut]
            bar.update(len(chunk))
    return done
