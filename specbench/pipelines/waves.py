"""``specbench eval``'s one wave loop, at every batch size: the queries are taken a wave at a time, and every method
decodes each wave (methods rotate from wave to wave: A B C, B C A, ...), its records written as the wave finishes.

Methods take turns from wave to wave starting at the run's ``seed`` (so repeated runs of one plan, seeded apart, start
their waves with different methods). At ``decoding.batch_size=1`` a wave is one query, or one conversation (``conversation_length``: its turns decoded in
order, each with the chat's history), decoded by the method's one selector for the run (``reset`` starts each query;
selectors that carry statistics across queries keep them). At ``decoding.batch_size=B`` a wave is
``decoding.batch_wave`` queries (by default 4 B) with at most ``B`` in flight, one target forward a round for all of
them (``decoding/engine.py``): a row that finishes gives its place to the wave's next query before the next round
(continuous batching), each row with its own copy of the method's selector (a row is a query; a policy's weights are
copied, not loaded again), its own limits (``decoding.fit_context`` cuts each row at the context's end on its own),
and, for ``goodput:<drafter>``, the method's batch budget (``decoding/batch_budget.py``; its forward costs measured at
start-up by ``pipelines/batch_costs.py``, cached per machine; its statistics carry across the run's waves and start
again when a run resumes). ``hf:generate`` is Hugging Face ``generate`` on the same queries in static left-padded
batches of ``B`` (it cannot refill a row; plain greedy only, the target's generation config pinned as ``specbench
bench`` pins it; it runs the model's own attention), timed the same way (its records keep no deciders, so its forks
are not certified: the page compares its outputs with batch 1's). What a batch cannot run is refused before any
model loads (``pipelines/batch_settings.py``).

Records at batch: one example record a query as always, its ``seconds`` the wave's wall time apportioned by new
tokens (``wave seconds * its tokens / the wave's tokens``), so a method's total seconds is the sum of its waves' and
the summary's speedup (total baseline seconds over total method seconds on the same queries) is the throughput ratio
at that batch size; per-query paired intervals on apportioned seconds say less than at batch 1: read the totals. Each
wave also gets a line of ``batches.jsonl``: the method, the wave's index (``batch``), its rows in flight (``rows``),
its query ids, its wall seconds, new tokens and target forwards.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import replace

import torch

from specbench.decoding.batch_budget import BatchBudget
from specbench.decoding.engine import BatchResult, Job, Player, verifier_for
from specbench.decoding.generation import Generation
from specbench.models.attention import stock_attention
from specbench.pipelines.batch_costs import batch_costs
from specbench.pipelines.batch_settings import batch_size, batch_wave, check_queries
from specbench.pipelines.bench import cut_at_eos, hf_generation_config
from specbench.pipelines.methods import Method
from specbench.pipelines.session.prompting import example_id, prompt_fingerprint, turns_of
from specbench.pipelines.session.schedule import rotation
from specbench.records import BATCHES, JsonlWriter


def decode_waves(
    s, methods: list[Method], selectors: dict, records, todo: set, conversation: int, bar
) -> None:
    """Every (query, method) of ``todo``, a wave at a time (the module's docstring), written as each wave finishes;
    ``selectors``: each method's one selector for the run (``evaluate.prepared_selectors``)."""
    size = batch_size(s.cfg)
    if size == 1:
        waves = [
            range(i, min(i + conversation, len(s.queries))) for i in range(0, len(s.queries), conversation)
        ]
        decoder = None
    else:
        check_queries(size, len(s.queries))
        wave = batch_wave(s.cfg)
        waves = [range(i, min(i + wave, len(s.queries))) for i in range(0, len(s.queries), wave)]
        decoder = Decoder(s, methods, selectors, size)
    offset = int(
        s.cfg.get("seed") or 0
    )  # the run's seed turns the methods' order too (repeated runs start apart)
    for wi, queries in enumerate(waves):
        for mi in rotation(len(methods), wi + offset):
            if not any((qi, mi) in todo for qi in queries):
                continue
            m = methods[mi]
            if decoder is None:
                one_by_one(s, m, selectors[m.name], records, queries, mi, conversation > 1)
            else:
                decoder.wave(m, mi, records, queries, wi)
            bar.update(sum((qi, mi) in todo for qi in queries))


def one_by_one(s, m: Method, selector, records, queries, mi: int, chat: bool) -> None:
    """Batch 1: each query of the wave (a conversation's turns, in order, each with the chat's history), one decode
    each; a finished turn is decoded again only to rebuild the chat's history."""
    max_turns = int(s.cfg.dataset.get("max_turns") or 1)
    history: list[tuple[str, str]] = []
    for qi in queries:
        query, rng = s.queries[qi], s.rng(qi, mi)
        for turn in range(turns_of(query, max_turns)):
            gen = s.decode(
                selector, s.prompter(query, turn, history), rng, replace(s.spec, stream=m.name), query=query
            )
            text = s.text(gen.tokens)
            history.append((s.prompter.user_text(query, turn), text))
            ex_id = example_id(query, turn)
            if (ex_id, m.name) in records.done:  # redone only to rebuild the chat history
                continue
            # the chat this generation is a turn of, and which turn
            chat_of = {"conversation": s.queries[queries[0]].id, "conversation_turn": len(history)}
            records.write(
                query,
                ex_id,
                m.name,
                gen,
                text,
                query.reference if turn == 0 else None,
                turn=turn + 1,
                **(chat_of if chat else {}),
            )


class Decoder:
    """A batched run's waves: one verifier of the target for the run (``engine.Rows``), each method's row selectors
    (copies of its one selector), its batch budget for ``goodput:`` methods (made on first use from the start-up
    forward costs), and ``hf_batch`` for ``hf:generate``."""

    def __init__(self, s, methods: list[Method], selectors: dict, size: int):
        self.s, self.size, self.selectors = s, size, selectors
        self.verifier = verifier_for(s.target, size)
        longest = max(
            (s.pool[m.drafter].draft_length or s.limits.draft_length for m in methods if m.budget),
            default=0,
        )
        self.costs = functools.cache(
            lambda: batch_costs(s.target, size, longest + 1, s.prompter(s.queries[0]), s.clock)
        )
        self.budgets: dict[str, BatchBudget] = {}
        self.warm = replace(s.spec, limits=s.warmup_limits) if s.warmup_limits is not None else None
        self.warmed: set[str] = set()

    def wave(self, m: Method, mi: int, records, queries, wi: int) -> None:
        """Method ``m`` (index ``mi``) decodes the wave ``wi`` of ``queries``; its records and its line written."""
        s = self.s
        chosen = [s.queries[qi] for qi in queries]
        prompts = [s.prompter(q) for q in chosen]
        spec = replace(s.spec, stream=m.name)
        if (
            self.warm is not None and m.name not in self.warmed
        ):  # untimed, once a method: a short run of a batch
            self.warmed.add(m.name)
            warm = replace(self.warm, stream=None)
            self(m, prompts[: self.size], chosen[: self.size], warm, s.rng(seed=0), learn=False)
        result = self(m, prompts, chosen, spec, s.rng(queries[0], mi))
        write_batch(s, records, m.name, chosen, prompts, result)
        with JsonlWriter(s.out / BATCHES) as log:
            log.write(
                {
                    "method": m.name,
                    "batch": wi,
                    "rows": self.size,
                    "query_ids": [example_id(q, 0) for q in chosen],
                    "seconds": result.seconds,
                    "new_tokens": result.new_tokens,
                    "forwards": result.forwards,
                }
            )

    def __call__(
        self, m: Method, prompts, queries, spec, rng: torch.Generator, learn: bool = True
    ) -> BatchResult:
        s = self.s
        if m.hf:  # static batches: generate cannot refill a finished row
            parts = [hf_batch(s, prompts[i : i + self.size], spec) for i in range(0, len(prompts), self.size)]
            return BatchResult(
                [g for p in parts for g in p.generations],
                sum(p.seconds for p in parts),
                sum(p.forwards for p in parts),
            )
        budget = None
        if m.budget:  # the run's budget of this method; a warm-up's own, which it forgets
            budget = self.budgets.get(m.name) if learn else None
            if budget is None:
                budget = BatchBudget(self.costs())
                if learn:
                    self.budgets[m.name] = budget
        prepared = self.selectors[m.name]
        jobs = [Job(Player(copy.deepcopy(prepared), s.pool), p, query=q) for p, q in zip(prompts, queries)]
        return s.decode_rows(jobs, rng, spec, width=self.size, budget=budget, verifier=self.verifier)


def hf_batch(s, prompts: list[list[int]], spec) -> BatchResult:
    """Hugging Face ``generate`` (greedy) on the left-padded batch, with the model's own attention, timed between two
    clock boundaries; each row's new tokens cut after its first EOS (kept), as ``specbench bench`` counts them."""
    model, tok, eos = s.target.model, s.loaded.tokenizer, s.eos_ids
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    config = hf_generation_config(model, eos, pad)
    config.max_new_tokens = spec.limits.max_new_tokens
    width = max(len(p) for p in prompts)
    device = s.target.device
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with stock_attention(model), torch.inference_mode():
        start = spec.clock.boundary()
        seq = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        seconds = spec.clock.boundary() - start
    gens = []
    for row in seq[:, width:].tolist():
        new = cut_at_eos(row, eos)
        stop = "eos" if new and new[-1] in eos else "length"
        gens.append(Generation(tokens=new, target_calls=len(new), stop=stop))
    return BatchResult(gens, seconds, seq.shape[1] - width)


def write_batch(s, records, method: str, queries, prompts, result: BatchResult) -> None:
    """Each row's example record, its seconds the wave's apportioned by new tokens (the module's docstring)."""
    total = max(result.new_tokens, 1)
    for q, prompt, gen in zip(queries, prompts, result.generations):
        ex_id = example_id(q, 0)
        if (ex_id, method) in records.done:
            continue
        gen.seconds = result.seconds * len(gen.tokens) / total
        gen.prompt_sha = prompt_fingerprint(prompt)
        records.write(q, ex_id, method, gen, s.text(gen.tokens), q.reference, turn=1)


__all__ = ["Decoder", "decode_waves", "hf_batch", "one_by_one", "write_batch"]
