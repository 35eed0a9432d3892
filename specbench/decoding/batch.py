"""Batched speculative decoding (issue 57, first part): several queries, each with its own drafter, verified in one
target forward per round.

Each round, every row still generating drafts on its own (its drafter's per-row copy, ``Drafter.for_row``, synced
with the row's committed tokens), then one forward of the target over every row's ``[last committed token, *draft]``
(``models/batched.py``: rows of different lengths, each at its own positions), then each row's greedy verdict, the
accepted prefix plus the target's token, exactly as a row decoded alone (``decode``) gets it; the cache keeps each
row's accepted slots. A row that reaches EOS or its ``max_new_tokens`` leaves the batch; the others go on. The
autoregressive arm drafts nothing: a batch of it is plain batched greedy decoding, the baseline at the same batch.

Greedy and lossless only for now: sampling at batch and the cascade rules are refused, as are drafters that cannot
draft per row yet (model drafters: their per-row caches are the next part), tree drafts are cut to their first path,
and a row's drafter is fixed for its whole generation (per-row selectors are the next part).

Times: ``BatchResult.seconds`` is the batch's wall time (one clock boundary at each end); a row's ``seconds`` is the
time until it finished; a round's ``t_draft`` is the row's own drafting and its ``t_verify`` its share of the
forward (the forward's seconds over the rows in it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from specbench.decoding.certify import deciders
from specbench.decoding.drafter import DecodeContext, Draft, Drafter, keep_tokens
from specbench.decoding.loop import DecodeSpec, Generation
from specbench.decoding.sampling import logits_to_probs
from specbench.decoding.verify import block_divergence, verify_greedy
from specbench.errors import SpecbenchError
from specbench.models.batched import BatchedLM
from specbench.records import Round


@dataclass
class BatchResult:
    generations: list[Generation]  # one per prompt, in the prompts' order
    seconds: float  # the batch's wall time, first forward to last
    forwards: int  # target forwards (prefill not counted)

    @property
    def new_tokens(self) -> int:
        return sum(len(g.tokens) for g in self.generations)


@dataclass
class _Row:
    tokens: list[int]  # committed: prompt, then output
    drafter: Drafter
    query: DecodeContext
    gen: Generation = field(default_factory=lambda: Generation(tokens=[], deciders=[]))


def check_batchable(spec: DecodeSpec) -> None:
    """Refuse, before any forward, a decoding a batch cannot do yet (naming it and the fix); a drafter that cannot
    draft per row is refused by its ``for_row`` as the rows are made."""
    if not spec.sampling.greedy:
        raise SpecbenchError(
            "batched decoding is greedy only for now (decoding.temperature > 0 was given)",
            "set decoding.temperature=0, or decode one query at a time (decoding.batch_size=1)",
        )
    if spec.cascade is not None and not spec.cascade.lossless:
        raise SpecbenchError(
            "batched decoding verifies losslessly only: a cascade rule was given",
            "drop the cascade rule (cascade=none), or decode one query at a time (decoding.batch_size=1)",
        )


def first_path(draft: Draft) -> Draft:
    """A tree draft's first path (each token the first child of the one before); a chain as it is."""
    if draft.parents is None:
        return draft
    path, last = [], -1
    for i, parent in enumerate(draft.parents):
        if parent == last:
            path.append(i)
            last = i
    return replace(keep_tokens(draft, path), parents=None)  # one path: a chain


def decode_batch(
    lm: BatchedLM,
    drafters: Sequence[Drafter],
    prompts: Sequence[list[int]],
    spec: DecodeSpec,
    rng: torch.Generator,
) -> BatchResult:
    """Greedy-decode every prompt (row ``i`` drafting with ``drafters[i]``) in one batch: see the module's docstring."""
    if len(drafters) != len(prompts) or not prompts:
        raise ValueError(
            f"{len(prompts)} prompts and {len(drafters)} drafters: one drafter a prompt, at least one"
        )
    check_batchable(spec)
    clock = spec.clock
    rows = [_Row(list(p), d.for_row(), DecodeContext(stream=spec.stream)) for p, d in zip(prompts, drafters)]
    start = clock.boundary()
    lm.start([r.tokens for r in rows])
    active, forwards = list(rows), 0
    while active:
        drafts, sizes, t_draft = zip(*(_draft(row, spec, rng) for row in active))
        t0 = clock.now()
        logits = lm.score([row.tokens[-1:] + d for row, d in zip(active, drafts)])
        share = (clock.now() - t0) / len(active)
        forwards += 1
        kept, going = [], []
        for i, row in enumerate(active):
            scored = logits[i, : len(drafts[i]) + 1]
            accepted, done = _commit(row, drafts[i], sizes[i], scored, spec, (t_draft[i], share))
            kept.append(1 + accepted)
            if done:
                row.gen.seconds = clock.now() - start
                row.drafter.finish()
            else:
                going.append(i)
        lm.keep(kept)
        if len(going) < len(active):
            if going:
                lm.drop(going)
            active = [active[i] for i in going]
    seconds = clock.boundary() - start
    return BatchResult([r.gen for r in rows], seconds, forwards)


def _draft(row: _Row, spec: DecodeSpec, rng: torch.Generator) -> tuple[list[int], int, float]:
    """The row's draft this round, the tokens it asked for (its draft length, no more than the room its
    ``max_new_tokens`` leaves beside the bonus token: the round's ``n_max``) and its seconds."""
    limits, clock = spec.limits, spec.clock
    room = limits.max_new_tokens - len(row.gen.tokens) - 1
    k = min(row.drafter.draft_length or limits.draft_length, room)
    if not row.drafter.drafts or k <= 0:
        return [], 0, 0.0
    t0 = clock.now()
    row.drafter.sync(row.query, row.tokens)
    made = row.drafter.propose(row.tokens, k, spec.sampling, rng, spec.eos_ids)
    return list(first_path(made).tokens[:k]), k, clock.now() - t0


def _commit(row: _Row, draft: list[int], n_max: int, logits, spec: DecodeSpec, times) -> tuple[int, bool]:
    """The row's greedy verdict appended (cut after an EOS) and its round recorded: (accepted, done)."""
    verdict = verify_greedy(draft, logits)
    new = verdict.tokens
    stop = next((i for i, tok in enumerate(new) if tok in spec.eos_ids), None)
    if stop is not None:
        new = new[: stop + 1]
        row.gen.stop = "eos"
    p = logits_to_probs(logits[: len(draft)], spec.sampling) if draft else None
    gen = row.gen
    gen.rounds.append(
        Round(
            index=len(gen.rounds),
            arm=row.drafter.name,
            drafted=len(draft),
            accepted=verdict.accepted,
            n_max=n_max,
            be=verdict.accepted / n_max if n_max else 0.0,
            bd=block_divergence(draft, None, p, n_max) if draft else 0.0,
            emitted=len(new),
            t_select=0.0,
            t_draft=times[0],
            t_verify=times[1],
            t_switch=0.0,
            switched=False,
        )
    )
    gen.deciders.extend(deciders(logits, len(new)))  # the rows that chose them: a fork's margins (certify)
    gen.tokens.extend(new)
    gen.target_calls += 1
    row.tokens.extend(new)
    return verdict.accepted, gen.stop == "eos" or len(gen.tokens) >= spec.limits.max_new_tokens


__all__ = ["BatchResult", "check_batchable", "decode_batch", "first_path"]
