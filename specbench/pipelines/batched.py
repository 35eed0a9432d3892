"""``specbench eval decoding.batch_size=B``: each method decodes a wave of queries (``decoding.batch_wave``, by default
4 B) with at most ``B`` in flight, one target forward a round for all of them (``decoding/batch.py``); a row that
finishes gives its place to the wave's next query before the next round (continuous batching), so a slow row does
not hold the batch's other places empty. Methods are interleaved wave by wave (A B A B over the same waves of
queries, as single-query eval interleaves them query by query). ``decoding.batch_wave=B`` decodes static batches.

What a batch can run (checked before any model loads, each refusal naming the method or key and the fix): the
autoregressive method (plain batched decoding, the baseline at the same batch) and ``fixed:<drafter>`` for
drafters whose kind drafts per row (prompt lookup, the retrieval drafter: their builder's ``batches``), lossless
(greedy or sampling), one turn a query; ``goodput:<drafter>``, the same drafter with the batch budget cutting every
round's drafts to the cap of the most expected tokens per predicted second (``selection/batch_budget.py``; its
forward costs measured at start-up by ``pipelines/batch_costs.py``, cached per machine; its acceptance statistics
carry across the run's batches and start again when a run resumes); and ``hf:generate``, Hugging Face ``generate``
on the same queries in static left-padded batches of ``B`` (it cannot refill a row; plain greedy only, the target's generation config pinned as ``specbench bench`` pins
it), timed the same way (its records keep no deciders, so its forks are not certified: the page compares its outputs
with batch 1's); and selector methods whose selector chooses arms, routes or trees over a pool of such drafters, each
row with a fresh selector of the method (a row is a query), the policy included (each row's prompt embedding pooled off
the batch's prefill). Model drafters (HF, the small drafter, the early exit) batch their rows in one drafter forward a
draft position; draft heads draft a row each, fed its row's target states. Routes and token trees (``tree:<a>+<b>``,
the tree bandits) run per row; the cost-model budget's plans are refused.

Records: one example record a query as always, its ``seconds`` the wave's wall time apportioned by new tokens
(``wave seconds * its tokens / the wave's tokens``), so a method's total seconds is the sum of its waves' and the
summary's speedup (total baseline seconds over total method seconds on the same queries) is the throughput ratio at
that batch size; per-query paired intervals on apportioned seconds say less than at batch 1: read the totals. Each
wave also gets a line of ``batches.jsonl``: the method, the wave's index (``batch``), its rows in flight
(``rows``), its query ids, its wall seconds, new tokens and target forwards.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch

from specbench.arms import AUTOREGRESSIVE, GOODPUT, HF_GENERATE
from specbench.decoding.batch import BatchResult, RowSelector, decode_batch
from specbench.decoding.loop import Generation
from specbench.models.batched import BatchedLM
from specbench.pipelines.batch_costs import batch_costs
from specbench.pipelines.batch_settings import batch_size, batch_wave, check_queries, drafter_of
from specbench.pipelines.bench import cut_at_eos, hf_generation_config
from specbench.pipelines.methods import Method
from specbench.pipelines.session.prompting import example_id, prompt_fingerprint
from specbench.pipelines.session.schedule import rotation
from specbench.records import BATCHES, JsonlWriter
from specbench.selection.batch_budget import BatchBudget


def decode_batches(s, methods, records, todo: set, bar) -> None:
    """Every (query, method) of ``todo``, a wave of ``decoding.batch_wave`` consecutive queries at a time with at most
    ``decoding.batch_size`` in flight (``batch_settings.batch_wave``), methods rotating per wave; each wave's records
    written as it finishes."""
    size, wave = batch_size(s.cfg), batch_wave(s.cfg)
    check_queries(size, len(s.queries))
    lm = BatchedLM(s.target.model, s.target.vocab_size)
    waves = [range(i, min(i + wave, len(s.queries))) for i in range(0, len(s.queries), wave)]
    warm = replace(s.spec, limits=s.warmup_limits) if s.warmup_limits is not None else None
    decoder = Decoder(s, lm, methods, size)
    for bi, batch in enumerate(waves):
        for mi in rotation(len(methods), bi):
            if not any((qi, mi) in todo for qi in batch):
                continue
            m = methods[mi]
            queries = [s.queries[qi] for qi in batch]
            prompts = [s.prompter(q) for q in queries]
            limits = [
                s.context.fit(q.id, len(p), s.limits, False, s.fit_context) for q, p in zip(queries, prompts)
            ]
            spec = replace(s.spec, stream=m.name, limits=min(limits, key=lambda x: x.max_new_tokens))
            if (
                warm is not None and bi == 0
            ):  # untimed, once per method: the first batch's prompts, a short run
                decoder(m, prompts[:size], replace(warm, stream=None), s.rng(seed=0), learn=False)
            result = decoder(m, prompts, spec, s.rng(batch[0], mi))
            write_batch(s, records, m.name, queries, prompts, result)
            with JsonlWriter(s.out / BATCHES) as log:
                log.write(
                    {
                        "method": m.name,
                        "batch": bi,
                        "rows": size,
                        "query_ids": [example_id(q, 0) for q in queries],
                        "seconds": result.seconds,
                        "new_tokens": result.new_tokens,
                        "forwards": result.forwards,
                    }
                )
            bar.update(sum((qi, mi) in todo for qi in batch))


class Decoder:
    """One batch of a method: ``decode_batch`` with the method's drafter (and, for ``goodput:<drafter>``, the
    method's batch budget, made on first use from the start-up forward costs), or with a fresh selector of a
    selector method for each row (``RowSelector``: a row is a query), or ``hf_batch``."""

    def __init__(self, s, lm: BatchedLM, methods, size: int):
        self.s, self.lm, self.size = s, lm, size
        longest = max(
            (
                s.pool[drafter_of(m.name)].draft_length or s.limits.draft_length
                for m in methods
                if m.name.startswith(GOODPUT)
            ),
            default=0,
        )
        self.costs = functools.cache(
            lambda: batch_costs(s.target, size, longest + 1, s.prompter(s.queries[0]), s.clock)
        )
        self.budgets: dict[str, BatchBudget] = {}

    def __call__(self, m: Method, prompts, spec, rng: torch.Generator, learn: bool = True) -> BatchResult:
        method, pool = m.name, self.s.pool
        if method == HF_GENERATE:  # static batches: generate cannot refill a finished row
            parts = [
                hf_batch(self.s, prompts[i : i + self.size], spec) for i in range(0, len(prompts), self.size)
            ]
            return BatchResult(
                [g for p in parts for g in p.generations],
                sum(p.seconds for p in parts),
                sum(p.forwards for p in parts),
            )
        budget = None
        if method.startswith(GOODPUT):  # the run's budget of this method; a warm-up's own, which it forgets
            budget = self.budgets.get(method) if learn else None
            if budget is None:
                budget = BatchBudget(self.costs())
                if learn:
                    self.budgets[method] = budget
        if method == AUTOREGRESSIVE or method.startswith(("fixed:", GOODPUT)):
            players = [pool[drafter_of(method)]] * len(prompts)
        else:  # a selector method: one selector a row
            players = [RowSelector(m.make_selector(), pool) for _ in prompts]
        return decode_batch(self.lm, players, prompts, spec, rng, budget, rows=self.size)


def hf_batch(s, prompts: list[list[int]], spec) -> BatchResult:
    """Hugging Face ``generate`` (greedy) on the left-padded batch, timed between two clock boundaries; each row's
    new tokens cut after its first EOS (kept), as ``specbench bench`` counts them."""
    model, tok, eos = s.target.model, s.loaded.tokenizer, s.eos_ids
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    config = hf_generation_config(model, eos, pad)
    config.max_new_tokens = spec.limits.max_new_tokens
    width = max(len(p) for p in prompts)
    device = s.target.device
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    start = spec.clock.boundary()
    with torch.inference_mode():
        seq = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    seconds = spec.clock.boundary() - start
    gens = []
    for row in seq[:, width:].tolist():
        new = cut_at_eos(row, eos)
        stop = "eos" if new and new[-1] in eos else "length"
        gens.append(Generation(tokens=new, target_calls=len(new), stop=stop))
    return BatchResult(gens, seconds, seq.shape[1] - width)


def write_batch(s, records, method: str, queries, prompts, result: BatchResult) -> None:
    """Each row's example record, its seconds the batch's apportioned by new tokens (the module's docstring)."""
    total = max(result.new_tokens, 1)
    for q, prompt, gen in zip(queries, prompts, result.generations):
        ex_id = example_id(q, 0)
        if (ex_id, method) in records.done:
            continue
        gen.seconds = result.seconds * len(gen.tokens) / total
        gen.prompt_sha = prompt_fingerprint(prompt)
        records.write(
            q,
            ex_id,
            method,
            gen,
            s.text(gen.tokens),
            q.reference,
            turn=1,
        )


__all__ = ["Decoder", "decode_batches", "hf_batch", "write_batch"]
