"""Batched speculative decoding (issue 57): several queries, each with its own drafter, verified in one target
forward per round.

Each round, every row still generating drafts on its own (its drafter's per-row copy, ``Drafter.for_rows``, synced
with the row's committed tokens; ``batch_drafts.py``), then one forward of the target over every row's ``[last
committed token, *draft]`` (``models/batched.py``: rows of different lengths, each at its own positions; a tree row's
nodes each at its depth, seeing its ancestors), then each row's verdict, by the same
pure functions as a row decoded alone (``decode``): greedy, the accepted prefix plus the target's token; sampling,
speculative sampling against the row's own processed target distributions (``verify_sampling``), its draws from the
batch's generator row after row, so each row's law is the target's. The cache keeps each row's accepted slots. A row
that reaches EOS or its ``max_new_tokens`` leaves the batch; the others go on, and with at most ``rows`` in flight the
next waiting prompt takes its place before the next round (continuous batching, ``BatchedLM.admit``). The autoregressive arm drafts nothing:
a batch of it is plain batched decoding, the baseline at the same batch.

Lossless only: the cascade rules are refused, as are dynamic draft trees (of heads and model drafters); a drafter
that plays alone has its retrieval tree draft cut to its first path (those drafters draft deterministically, so any
path of theirs is a valid draft under sampling). A model drafter or a draft head drafts every row that uses it in one
forward a position, with one batched cache of its own (``drafters/batched.py``); a head feeds each row its own target
states, which the prefill and every round's forward record (``BatchedLM.start`` and ``score`` with the heads'
layers). Greedy rows record their deciders (``certify``); sampled rows none.

A row drafts with one drafter for its whole generation, or (a ``RowSelector``) chooses its drafter each round with its
own selector over the pool: one state a row, as a row is a query (each row's selector is reset when the row starts
and updated with the row's own feedback after each round, as the single-query loop updates it); a row's selector
chooses one arm a round, a route (the router: its first drafter's draft plays when its match is long enough, else
its fallback drafts instead) or several arms (a token tree of their drafts, ``tree:<a>+<b>`` and the tree bandits),
resolved by the loop's own ``round_members``; a tree row is verified by the loop's tree verdicts
(``verify_tree_greedy``, SpecInfer's ``verify_tree_sampling``), its selector taught each member's feedback by the
loop's ``rounds.learn``, and the cache keeps its root and accepted path (``BatchedLM.keep_slots``). A cost-model plan
is refused (its costs are a row's alone). A selector that
chooses by the query's embedding (the policy) gets its row's prompt embedding, pooled off the batch's own prefill
(``BatchedLM.start``), before its reset, as the single-query loop gives it the prefill's.

With a ``budget`` (``selection/batch_budget.py``: the ``goodput:<drafter>`` methods) every row's draft is cut, each
round, to the cap the budget chooses for the whole batch from the forward's measured cost at this many rows and
each draft's expected accepted tokens (0: no row drafts this round); each round records the row's expected accepted
tokens and its share of the predicted forward seconds, and the budget learns from every verdict. A cut draft is
verified as a shorter draft would be: greedy outputs stay the rows' own, and sampled rows keep the target's law.
Before any row drafts, the budget bounds each draft's chances from above (``BatchBudget.may_draft``); where even
the bound pays no cap, no row drafts that round (its plan would have cut every draft to nothing), so a large batch
that has stopped speculating stops paying for drafts too.

Times: ``BatchResult.seconds`` is the batch's wall time (one clock boundary at each end); a row's ``seconds`` is the
time until it finished; a round's ``t_draft`` is the row's own drafting and its ``t_verify`` its share of the
forward (the forward's seconds over the rows in it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from specbench.decoding.batch_drafts import Turn, drafts, first_path
from specbench.decoding.certify import deciders
from specbench.decoding.drafter import DecodeContext, Draft, Drafter, keep_tokens
from specbench.decoding.loop import DecodeSpec, Generation
from specbench.decoding.rounds import Verified, learn, tree_label
from specbench.decoding.sampling import logits_to_probs
from specbench.decoding.tree import (
    chain_outcomes,
    member_divergence,
    verify_tree_greedy,
    verify_tree_sampling,
)
from specbench.decoding.verify import block_divergence, block_efficiency, verify_greedy, verify_sampling
from specbench.errors import SpecbenchError
from specbench.models.batched import BatchedLM
from specbench.records import Round
from specbench.selection.base import Plan, Route, Selector, feedback_of

if TYPE_CHECKING:
    from specbench.selection.batch_budget import BatchBudget


@dataclass
class BatchResult:
    generations: list[Generation]  # one per prompt, in the prompts' order
    seconds: float  # the batch's wall time, first forward to last
    forwards: int  # target forwards (prefill not counted)

    @property
    def new_tokens(self) -> int:
        return sum(len(g.tokens) for g in self.generations)


@dataclass(frozen=True)
class RowSelector:
    """A row that chooses its drafter each round: its own ``selector`` (a fresh one a row) over ``pool``."""

    selector: Selector
    pool: Mapping[str, Drafter]


@dataclass
class _Row:
    tokens: list[int]  # committed: prompt, then output
    pool: dict[str, Drafter]  # the row's own copies (``for_row``) of the drafters it may play
    arm: str  # the drafter it plays this round
    query: DecodeContext
    gen: Generation  # deciders: a list for greedy rows (certify), None for sampled ones
    selector: Selector | None = None
    # this round's choice: an arm, or a route or several arms (``batch_drafts._resolve``)
    choice: object = None
    t0: float = 0.0  # when the row joined the batch (its prefill began): its ``seconds`` run from there

    @property
    def drafter(self) -> Drafter:
        return self.pool[self.arm]

    @classmethod
    def make(
        cls, prompt: list[int], player: Drafter | RowSelector, pool: dict[str, Drafter], spec: DecodeSpec
    ):
        """The row of ``prompt``, playing ``player`` with ``pool``, its own copies of the drafters it may play."""
        gen = Generation(tokens=[], deciders=[] if spec.sampling.greedy else None)
        query = DecodeContext(stream=spec.stream)
        if isinstance(player, RowSelector):
            return cls(list(prompt), pool, next(iter(pool)), query, gen, player.selector)
        return cls(list(prompt), pool, player.name, query, gen, choice=player.name)

    def begin(self, embedding: torch.Tensor | None) -> None:
        """The row starts: its selector is reset, after its prompt's embedding where it chooses by one."""
        if self.selector is None:
            return
        if self.selector.embedding_pooling is not None:
            self.selector.set_embedding(embedding)
        self.selector.reset()

    def choose(self) -> None:
        """This round's choice: the row's selector's (one arm; a route or several arms, resolved as the row drafts,
        ``batch_drafts._resolve``), or its one drafter."""
        if self.selector is None:
            return
        choice = self.selector.select()
        if isinstance(choice, Plan):
            raise _one_arm(self.selector, "a cost-model plan", self.pool)
        named = (
            [choice]
            if isinstance(choice, str)
            else [choice.first, *([choice.then] if isinstance(choice.then, str) else choice.then)]
            if isinstance(choice, Route)
            else list(choice)
            if isinstance(choice, (tuple, list))
            else []
        )
        if not named or any(not isinstance(a, str) or a not in self.pool for a in named):
            raise _one_arm(self.selector, repr(choice), self.pool)
        self.choice, self.arm = choice, named[0]

    def learn(self, rnd: Round, made: Draft) -> None:
        if self.selector is None:
            return
        self.selector.update(rnd.arm, feedback_of(rnd, chain_outcomes(len(made.tokens), rnd.accepted)))


def _admit(
    lm: BatchedLM,
    players: Sequence[Drafter | RowSelector],
    prompts: Sequence[list[int]],
    spec: DecodeSpec,
    first: bool,
    reads: tuple[str | None, tuple[int, ...]],
) -> list[_Row]:
    """The rows of ``prompts`` made (each with its own copies of its drafters, ``_pools``) and prefilled: the batch's
    first rows start the cache, later ones join it (``BatchedLM.admit``). ``reads``: what every row's prefill gives,
    the whole batch's (``_pooling``, ``_state_layers``), so a row that joins later has what the others had: its prompt's
    embedding where selectors choose by one, the target's states at its cached positions where drafters read them
    (heads). Each row's selector is started, and its clock."""
    rows = [_Row.make(p, d, pool, spec) for p, d, pool in zip(prompts, players, _pools(players, prompts))]
    pooling, layers = reads
    t0 = spec.clock.now()
    started = (lm.start if first else lm.admit)([r.tokens for r in rows], pooling, layers)
    for i, row in enumerate(rows):
        row.begin(None if started.embeddings is None else started.embeddings[i])
        row.t0 = t0
        if layers:
            row.query.record_states(started.states[i], rows=len(row.tokens) - 1, start=0)
    return rows


def _state_layers(players: Sequence[Drafter | RowSelector]) -> tuple[int, ...]:
    """The target layers whose states the rows' drafters read (heads): recorded at the prefill and every round."""
    drafters = [d for p in players for d in (p.pool.values() if isinstance(p, RowSelector) else [p])]
    return tuple(sorted({layer for d in drafters for layer in d.state_layers(False)}))


def _pooling(players: Sequence[Drafter | RowSelector]) -> str | None:
    """The pooling of the prompt embeddings the rows' selectors choose by (read off the batch's prefill), or None."""
    poolings = {p.selector.embedding_pooling for p in players if isinstance(p, RowSelector)} - {None}
    if len(poolings) > 1:
        raise SpecbenchError(
            f"the rows' selectors pool their prompt embeddings differently ({', '.join(sorted(poolings))}), and a "
            "batch embeds its prompts once",
            "give the rows of one batch selectors of one embedding pooling, or decoding.batch_size=1",
        )
    return next(iter(poolings), None)


def _pools(
    players: Sequence[Drafter | RowSelector], prompts: Sequence[list[int]]
) -> list[dict[str, Drafter]]:
    """Each row's own copies of the drafters it may play, in its pool's order: every drafter is asked once for all
    the rows that may play it (``Drafter.for_rows``), so one that drafts many rows in one forward shares that forward
    among them."""
    named = []
    for player in players:
        if isinstance(player, RowSelector):
            named.append(list(player.pool.items()))
        else:
            named.append([(player.name, player)])
    users: dict[int, list[int]] = {}
    drafters: dict[int, Drafter] = {}
    for i, pairs in enumerate(named):
        for _, d in pairs:
            users.setdefault(id(d), []).append(i)
            drafters[id(d)] = d
    copies: dict[tuple[int, int], Drafter] = {}
    for key, rows in users.items():
        for i, copy in zip(rows, drafters[key].for_rows([list(prompts[i]) for i in rows])):
            copies[key, i] = copy
    return [{name: copies[id(d), i] for name, d in pairs} for i, pairs in enumerate(named)]


def _one_arm(selector: Selector, chose: str, pool: Mapping) -> SpecbenchError:
    return SpecbenchError(
        f"a row's selector ({type(selector).__name__}) chooses {chose}: in a batch a row plays drafters of its "
        f"pool ({', '.join(pool)}) as one arm, a route or a token tree a round",
        "use a selector that chooses arms, routes or trees (not cost-model plans) in a batch, or "
        "decoding.batch_size=1",
    )


def check_batchable(spec: DecodeSpec) -> None:
    """Refuse, before any forward, a decoding a batch cannot do yet (naming it and the fix); a drafter that cannot
    draft per row is refused by its ``for_row`` as the rows are made."""
    if spec.cascade is not None and not spec.cascade.lossless:
        raise SpecbenchError(
            "batched decoding verifies losslessly only: a cascade rule was given",
            "drop the cascade rule (cascade=none), or decode one query at a time (decoding.batch_size=1)",
        )


def decode_batch(
    lm: BatchedLM,
    drafters: Sequence[Drafter | RowSelector],
    prompts: Sequence[list[int]],
    spec: DecodeSpec,
    rng: torch.Generator,
    budget: BatchBudget | None = None,
    rows: int | None = None,
) -> BatchResult:
    """Decode every prompt (row ``i`` drafting with ``drafters[i]``, or choosing each round with its ``RowSelector``),
    at most ``rows`` at once (None: all of them in one batch): when a row finishes, the next waiting prompt takes its
    place before the next round (continuous batching), so a slow row does not hold the batch's other places empty.
    Each round's drafts are cut to ``budget``'s cap when one is given: see the module's docstring."""
    if len(drafters) != len(prompts) or not prompts:
        raise ValueError(
            f"{len(prompts)} prompts and {len(drafters)} drafters: one drafter a prompt, at least one"
        )
    width = len(prompts) if rows is None else rows
    if width < 1:
        raise ValueError(f"at most {rows} rows at once: at least 1")
    check_batchable(spec)
    clock = spec.clock
    reads = _pooling(drafters), _state_layers(drafters)
    waiting, made = list(range(len(prompts))), {}
    start = clock.boundary()
    active, forwards = [], 0
    while active or waiting:
        if waiting and len(active) < width:
            joining, waiting = waiting[: width - len(active)], waiting[width - len(active) :]
            players, joined = [drafters[i] for i in joining], [prompts[i] for i in joining]
            new = _admit(lm, players, joined, spec, not active, reads)
            made.update(zip(joining, new))
            active += new
        active = _step(lm, active, spec, rng, budget, (reads[1], forwards))
        forwards += 1
    seconds = clock.boundary() - start
    return BatchResult([made[i].gen for i in range(len(prompts))], seconds, forwards)


def _step(
    lm: BatchedLM, active: list[_Row], spec: DecodeSpec, rng: torch.Generator, budget, at: tuple
) -> list[_Row]:
    """One round of every active row: drafts (cut to the budget's cap), one target forward (``at``: the layers whose
    states it records, and its index in the batch, which each row's round records), each row's verdict; the rows
    still generating (finished rows have left the batch)."""
    clock, (layers, forward) = spec.clock, at
    for row in active:
        row.choose()
    turns, plan = _cap(active, drafts(active, spec, rng, budget), budget)
    t0 = clock.now()
    trees = [None if t.tree is None else (t.tree.attention(), t.tree.positions()) for t in turns]
    logits = lm.score([row.tokens[-1:] + t.tokens for row, t in zip(active, turns)], layers, trees)
    share = (clock.now() - t0) / len(active)
    kept, going = [], []
    for i, row in enumerate(active):
        turn = turns[i]
        slots, done = _verify(row, turn, logits[i], spec, share, rng)
        planned = {} if plan is None else {"expected": plan[0][i], "predicted_s": plan[1]}
        row.gen.rounds[-1] = replace(row.gen.rounds[-1], forward=forward, **planned)
        if plan is not None:
            budget.observe(row.arm, turn.draft, len(slots) - 1)
        kept.append(slots)
        if layers and not done:  # rows of the last committed token and the accepted draft tokens
            at = len(row.tokens) - len(slots) - 1
            row.query.record_states({k: x[i][slots] for k, x in lm.last_states.items()}, len(slots), at)
        if done:
            row.gen.seconds = clock.now() - row.t0
            for drafter in row.pool.values():
                drafter.finish()
        else:
            going.append(i)
    lm.keep_slots(kept)
    if len(going) < len(active) and going:
        lm.drop(going)
    return [active[i] for i in going]


def _cap(active: list[_Row], turns: list[Turn], budget: BatchBudget | None):
    """Each row's turn this round: whole, or its chain cut to the budget's cap, with the budget's plan ``(each row's
    expected accepted tokens, each row's share of the predicted seconds)``; a budget plans chains of one drafter a
    row only."""
    if budget is None:
        return turns, None
    for row, t in zip(active, turns):
        if not isinstance(row.choice, str):
            raise SpecbenchError(
                f"a row chose {row.choice!r} under the batch budget, which plans one drafter's chain a row",
                "give the batch budget fixed drafters (goodput:<drafter>), or drop the budget",
            )
        if t.draft.scores is not None and not row.drafter.scored:
            raise SpecbenchError(
                f"drafter {row.arm!r} ({type(row.drafter).__name__}) drafted with scores but does not declare "
                "scored = True: the batch budget bounds its acceptance before it drafts by its depth alone",
                f"set scored = True on {type(row.drafter).__name__} (its drafts carry Draft.scores)",
            )
    cap, expected, seconds = budget.plan([(row.arm, t.draft) for row, t in zip(active, turns)])
    cut = [replace(t, draft=keep_tokens(t.draft, range(min(cap, len(t.draft.tokens))))) for t in turns]
    return cut, (expected, seconds / len(active))


def _verify(row: _Row, turn: Turn, logits, spec: DecodeSpec, share: float, rng) -> tuple[list[int], bool]:
    """The row's verdict on its turn (its chain, or its token tree) from its rows of the forward, its round recorded
    and its selector taught: (the forward's rows it keeps: its last committed token and accepted tokens, done)."""
    times = (turn.seconds, share)
    if turn.tree is not None:
        return _commit_tree(row, turn, logits[: turn.tree.size + 1], spec, times, rng)
    scored = logits[: len(turn.draft.tokens) + 1]
    accepted, done = _commit(row, turn.draft, turn.n_max, scored, spec, times, rng)
    row.learn(row.gen.rounds[-1], turn.draft)
    return list(range(accepted + 1)), done


def _commit(row: _Row, made: Draft, n_max: int, logits, spec: DecodeSpec, times, rng) -> tuple[int, bool]:
    """The row's verdict on its chain (greedy, or speculative sampling) appended and its round recorded:
    (accepted, done)."""
    draft = list(made.tokens)
    if spec.sampling.greedy:
        verdict = verify_greedy(draft, logits)
        p = logits_to_probs(logits[: len(draft)], spec.sampling) if draft else None
    else:
        p = logits_to_probs(logits, spec.sampling)
        verdict = verify_sampling(draft, made.probs, p, rng)
    bd = block_divergence(draft, made.probs, p, n_max) if draft else 0.0
    rnd = _round(row, row.arm, len(draft), verdict.accepted, n_max, bd, times)
    new = _emit(row, verdict.tokens, logits, spec)
    row.gen.rounds.append(replace(rnd, emitted=len(new)))
    return verdict.accepted, _done(row, spec)


def _commit_tree(row: _Row, turn: Turn, logits, spec: DecodeSpec, times, rng) -> tuple[list[int], bool]:
    """The row's verdict on its token tree, as the loop judges one (``rounds.verify_tree``: the argmax walk, or
    SpecInfer's multi-step sampling), appended; its round recorded and its selector taught each member's own
    feedback (``rounds.learn``): (the forward's rows along the accepted path, done)."""
    tree, made, sampling = turn.tree, turn.made, spec.sampling
    p_all = logits_to_probs(logits, sampling)
    if sampling.greedy:
        verdict = verify_tree_greedy(tree, logits)
    else:
        verdict = verify_tree_sampling(tree, {m: d.draft.probs for m, d in made.items()}, p_all, rng)
    slots = tree.rows(verdict.path)
    mine = {m: member_divergence(tree, m, d.draft.probs, p_all, d.n_max) for m, d in made.items()}
    path = [tree.tokens[n] for n in verdict.path]
    label = tree_label(turn.members)
    v = Verified(
        label,
        verdict.tokens,
        verdict,
        logits[slots],
        p_all[slots[:-1]],
        {},
        path,
        turn.n_max,
        0.0,
        tree=tree,
        mine=mine,
    )
    v.new = _emit(row, verdict.tokens, v.logits, spec)
    rnd = _round(row, label, tree.size, v.accepted, turn.n_max, max(mine.values()), times)
    rnd = replace(rnd, emitted=len(v.new), tree_size=tree.size)
    learn(row.selector, rnd, turn.members, made, v)
    row.gen.rounds.append(rnd)
    return slots, _done(row, spec)


def _round(row: _Row, arm: str, drafted: int, accepted: int, n_max: int, bd: float, times) -> Round:
    """The row's round record (``emitted`` set once the output is cut at EOS)."""
    gen = row.gen
    return Round(
        index=len(gen.rounds),
        arm=arm,
        drafted=drafted,
        accepted=accepted,
        n_max=n_max,
        be=block_efficiency(accepted, n_max),
        bd=bd,
        emitted=0,
        t_select=0.0,
        t_draft=times[0],
        t_verify=times[1],
        t_switch=0.0,
        switched=bool(gen.rounds) and gen.rounds[-1].arm != arm,
    )


def _emit(row: _Row, tokens: list[int], logits, spec: DecodeSpec) -> list[int]:
    """The round's output cut after an EOS (kept), certified (a greedy row's deciders: the rows that chose it) and
    appended to the row."""
    stop = next((i for i, tok in enumerate(tokens) if tok in spec.eos_ids), None)
    new = list(tokens) if stop is None else list(tokens[: stop + 1])
    gen = row.gen
    if stop is not None:
        gen.stop = "eos"
    if gen.deciders is not None:
        gen.deciders.extend(deciders(logits, len(new)))
    gen.tokens.extend(new)
    gen.target_calls += 1
    row.tokens.extend(new)
    return new


def _done(row: _Row, spec: DecodeSpec) -> bool:
    return row.gen.stop == "eos" or len(row.gen.tokens) >= spec.limits.max_new_tokens


__all__ = ["BatchResult", "RowSelector", "check_batchable", "decode_batch", "first_path"]
