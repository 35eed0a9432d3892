"""The one decode loop. Every method, autoregressive decoding included, runs through ``decode``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from specbench.decoding.cascade import Cascade
from specbench.decoding.sampling import SamplingParams, logits_to_probs
from specbench.decoding.verify import block_divergence, block_efficiency, verify_greedy, verify_sampling
from specbench.drafters.base import Draft, Drafter
from specbench.errors import SpecbenchError
from specbench.models.target import Target
from specbench.records import Round
from specbench.selection.base import Feedback, Selector
from specbench.timing import Clock


@dataclass(frozen=True)
class Limits:
    max_new_tokens: int = 128
    draft_length: int = 4

    def __post_init__(self):
        if self.draft_length < 1:
            raise SpecbenchError(f"draft length must be at least 1, got {self.draft_length}",
                                 "set decoding.draft_length to 1 or more (use the autoregressive arm for no draft)")
        if self.max_new_tokens < 1:
            raise SpecbenchError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}",
                                 "set decoding.max_new_tokens to 1 or more")


@dataclass
class Generation:
    tokens: list[int]
    rounds: list[Round] = field(default_factory=list)
    target_calls: int = 0
    seconds: float = 0.0
    stop: str = "length"  # "eos" or "length"

    @property
    def drafted(self) -> int:
        return sum(r.drafted for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)

    @property
    def deferred(self) -> int:
        return sum(r.deferred for r in self.rounds)

    @property
    def switches(self) -> int:
        return sum(r.switched for r in self.rounds)


def decode(target: Target, pool: Mapping[str, Drafter], selector: Selector, prompt_ids: list[int], *,
           sampling: SamplingParams, limits: Limits, eos_ids: frozenset[int], rng: torch.Generator,
           clock: Clock, query=None, on_round: Callable[[Round], None] | None = None,
           cascade: Cascade | None = None) -> Generation:
    """Generate up to ``limits.max_new_tokens`` tokens for one prompt (batch size 1).

    Each round: the selector picks an arm; its drafter catches up with the committed tokens
    (``sync``: timed as switching cost when the previous round used another arm) and proposes up
    to ``draft_length`` tokens; one target forward scores them; verification keeps the accepted
    prefix plus one target token; the cache is rolled back to that; the selector gets feedback.
    Output stops after an EOS (kept, even inside an accepted draft) or at ``max_new_tokens``.
    ``seconds`` covers everything from the prefill on, read from ``clock`` at the boundaries.
    ``cascade``: a deferral rule verifying against its mixture instead of the target (lossy); ``None``
    or rule ``none`` is lossless verification (then every drafted position counts as deferred).

    With a ``full_information`` selector the verification forward also returns the target's hidden
    states, and every early-exit arm that was not played gets its Block Divergence at the drafted
    positions (``observe``); that work is timed as selector time (``t_select``).
    """
    t_start = clock.now()
    # A context-aware selector reads the query's embedding, taken from the prefill (timed).
    embedding = target.prefill(prompt_ids, embedding=selector.embedding_pooling)
    for drafter in pool.values():
        drafter.reset(target.encoder_ids)
    t_reset = clock.now()
    if embedding is not None:
        selector.set_embedding(embedding)
    selector.reset(query)
    t_reset = clock.now() - t_reset  # the selector's per-query work, counted in the first round's t_select
    side_arms = [name for name, d in pool.items() if d.exit_layer is not None] if selector.full_information else []
    out: list[int] = []
    gen = Generation(tokens=out)
    prev_arm = None
    while len(out) < limits.max_new_tokens:
        t0 = clock.now()
        arm = selector.select()
        t1 = clock.now()
        drafter = pool[arm]
        # Leave room for the bonus token so a round never overshoots max_new_tokens.
        k = min(limits.draft_length, limits.max_new_tokens - len(out) - 1)
        switched = prev_arm is not None and arm != prev_arm
        drafter.sync(target.tokens)
        t2 = clock.now()
        # A lossy cascade rule may keep the last draft token too, so it drafts one token more (in the
        # bonus token's room) and the target scores all but that one: a round whose drafts are all kept
        # emits only drafter tokens, and at a never-deferring alpha the output is the drafter's own.
        lossy = cascade is not None and not cascade.lossless
        n_draft = k + 1 if lossy else k
        draft = drafter.propose(target.tokens, n_draft, sampling, rng, eos_ids) if n_draft > 0 else Draft([], None)
        t3 = clock.now()
        scored = draft.tokens[:k]  # [k + 1, V] logits: a bonus row unless the draft has k + 1 tokens
        states = None
        if side_arms and draft.tokens:
            logits, states = target.score(scored, hidden=True)
        else:
            logits = target.score(scored)
        deferred = len(draft.tokens) if cascade is not None else 0
        if lossy and draft.tokens:
            verdict, deferred = cascade.verify(draft.tokens, draft.probs, draft.raw, logits, sampling, rng)
            p = logits_to_probs(logits, sampling)
        elif sampling.greedy:
            verdict = verify_greedy(draft.tokens, logits)
            p = logits_to_probs(logits[: len(draft.tokens)], sampling) if draft.tokens else None
        else:
            p = logits_to_probs(logits, sampling)
            verdict = verify_sampling(draft.tokens, draft.probs, p, rng)
        new = verdict.tokens
        for i, tok in enumerate(new):
            if tok in eos_ids:
                new = new[: i + 1]
                gen.stop = "eos"
                break
        accepted = min(verdict.accepted, len(new))
        n_max = n_draft if arm != "autoregressive" else 0
        bd = block_divergence(draft.tokens, draft.probs, p, n_max) if draft.tokens else 0.0
        out.extend(new)
        done = gen.stop == "eos" or len(out) >= limits.max_new_tokens
        if not done:
            target.commit(new)
        t4 = clock.now()
        side = {} if states is None else side_observations(pool, side_arms, arm, states, p, draft.tokens, sampling)
        t5 = clock.now()
        t_select = (t1 - t0) + (t5 - t4) + (0.0 if gen.rounds else t_reset)
        rnd = Round(index=len(gen.rounds), arm=arm, drafted=len(draft.tokens), accepted=accepted, n_max=n_max,
                    be=block_efficiency(accepted, n_max), bd=bd, emitted=len(new), t_select=t_select,
                    t_draft=(t3 - t2) if switched else (t3 - t1), t_verify=t4 - t3,
                    t_switch=(t2 - t1) if switched else 0.0, switched=switched, deferred=deferred)
        gen.rounds.append(rnd)
        selector.update(arm, Feedback(drafted=rnd.drafted, accepted=accepted, n_max=n_max, be=rnd.be, bd=bd,
                                      t_draft=rnd.t_draft, t_verify=rnd.t_verify, t_switch=rnd.t_switch))
        for name, side_bd in side.items():
            selector.observe(name, side_bd)
        if on_round is not None:
            on_round(rnd)
        prev_arm = arm
        if done:
            break
    gen.target_calls = target.calls
    gen.seconds = clock.now() - t_start
    return gen


def side_observations(pool: Mapping[str, Drafter], arms: list[str], played: str, states: tuple, p: torch.Tensor,
                      draft: list[int], sampling: SamplingParams) -> dict[str, float]:
    """Block Divergence of each early-exit arm in ``arms`` but ``played`` at the ``k = len(draft)`` drafted positions.

    Arm e's distribution at position j is read off the target's own state after ``e.exit_layer``
    layers (the context is the played draft, which the target scored); the mean over the ``k``
    positions is its BD for the round (``k`` is the denominator: every position was observed).
    Exits that share an LM head (the target's) run it once over all their rows: on CPUs the head's
    weight read is the cost.
    """
    k = len(draft)
    others = [name for name in arms if name != played]
    groups: dict[int, list[str]] = {}
    for name in others:
        groups.setdefault(id(pool[name].head), []).append(name)
    out = {}
    for names in groups.values():
        x = torch.cat([pool[n].head_input(states[pool[n].exit_layer][:k]) for n in names])
        q = logits_to_probs(pool[names[0]].head_logits(x), sampling)
        for i, name in enumerate(names):
            out[name] = block_divergence(draft, q[i * k:(i + 1) * k], p, k)
    return out
