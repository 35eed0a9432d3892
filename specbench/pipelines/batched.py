"""``specbench eval decoding.batch_size=B``: each method decodes ``B`` queries at a time, one target forward a round for
all of them (``decoding/batch.py``), interleaved with the other methods batch by batch (A B A B over the same
batches of queries, as single-query eval interleaves them query by query).

What a batch can run (checked before any model loads, each refusal naming the method or key and the fix): the
autoregressive method (plain batched greedy decoding, the baseline at the same batch) and ``fixed:<drafter>`` for
drafters whose kind drafts per row (prompt lookup, the retrieval drafter: their builder's ``batches``), greedy, lossless,
one turn a query. Selectors (bandits, trees, the budget, the policy) and model drafters are the next part of issue 57.

Records: one example record a query as always, its ``seconds`` the batch's wall time apportioned by new tokens
(``batch seconds * its tokens / the batch's tokens``), so a method's total seconds is the sum of its batches' and the
summary's speedup (total baseline seconds over total method seconds on the same queries) is the throughput ratio at
that batch size; per-query paired intervals on apportioned seconds say less than at batch 1: read the totals. Each
batch also gets a line of ``batches.jsonl``: the method, the batch's index and query ids, its wall seconds, new
tokens and target forwards.
"""

from __future__ import annotations

from dataclasses import replace

from specbench.arms import AUTOREGRESSIVE
from specbench.decoding.batch import BatchResult, decode_batch
from specbench.models.batched import BatchedLM
from specbench.pipelines.batch_settings import batch_size, check_queries
from specbench.pipelines.session.prompting import example_id, prompt_fingerprint
from specbench.pipelines.session.schedule import rotation
from specbench.records import BATCHES, JsonlWriter


def decode_batches(s, methods, records, todo: set, bar) -> None:
    """Every (query, method) of ``todo``, a batch of ``decoding.batch_size`` consecutive queries at a time, methods
    rotating per batch; each batch's records written as it finishes."""
    size = batch_size(s.cfg)
    check_queries(size, len(s.queries))
    lm = BatchedLM(s.target.model, s.target.vocab_size)
    batches = [range(i, min(i + size, len(s.queries))) for i in range(0, len(s.queries), size)]
    warm = replace(s.spec, limits=s.warmup_limits) if s.warmup_limits is not None else None
    for bi, batch in enumerate(batches):
        for mi in rotation(len(methods), bi):
            if not any((qi, mi) in todo for qi in batch):
                continue
            m = methods[mi]
            arm = m.name.split(":", 1)[1] if m.name.startswith("fixed:") else AUTOREGRESSIVE
            queries = [s.queries[qi] for qi in batch]
            prompts = [s.prompter(q) for q in queries]
            limits = [
                s.context.fit(q.id, len(p), s.limits, False, s.fit_context) for q, p in zip(queries, prompts)
            ]
            spec = replace(s.spec, stream=m.name, limits=min(limits, key=lambda x: x.max_new_tokens))
            if (
                warm is not None and bi == 0
            ):  # untimed, once per method: the first batch's prompts, a short run
                decode_batch(
                    lm, [s.pool[arm]] * len(batch), prompts, replace(warm, stream=None), s.rng(seed=0)
                )
            result = decode_batch(lm, [s.pool[arm]] * len(batch), prompts, spec, s.rng(batch[0], mi))
            write_batch(s, records, m.name, queries, prompts, result)
            with JsonlWriter(s.out / BATCHES) as log:
                log.write(
                    {
                        "method": m.name,
                        "batch": bi,
                        "query_ids": [example_id(q, 0) for q in queries],
                        "seconds": result.seconds,
                        "new_tokens": result.new_tokens,
                        "forwards": result.forwards,
                    }
                )
            bar.update(sum((qi, mi) in todo for qi in batch))


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


__all__ = ["decode_batches", "write_batch"]
