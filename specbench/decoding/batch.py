"""Batched speculative decoding (issue 57, first part): several queries, each with its own drafter, verified in one
target forward per round.

Each round, every row still generating drafts on its own (its drafter's per-row copy, ``Drafter.for_row``, synced
with the row's committed tokens), then one forward of the target over every row's ``[last committed token, *draft]``
(``models/batched.py``: rows of different lengths, each at its own positions), then each row's verdict, by the same
pure functions as a row decoded alone (``decode``): greedy, the accepted prefix plus the target's token; sampling,
speculative sampling against the row's own processed target distributions (``verify_sampling``), its draws from the
batch's generator row after row, so each row's law is the target's. The cache keeps each row's accepted slots. A row
that reaches EOS or its ``max_new_tokens`` leaves the batch; the others go on. The autoregressive arm drafts nothing:
a batch of it is plain batched decoding, the baseline at the same batch.

Lossless only: the cascade rules are refused, as are dynamic draft trees (of heads and model drafters); a
retrieval drafter's tree draft is cut to its first path (those drafters draft deterministically, so any path of
theirs is a valid draft under sampling). A model drafter drafts every row that uses it in one forward a position,
with one batched cache of its own (``drafters/batched.py``); a draft head drafts each row with a cache of its own from
the row's target states, which the prefill and every round's forward record (``BatchedLM.start`` and ``score`` with
the heads' layers). Greedy rows record their deciders (``certify``); sampled rows none.

A row drafts with one drafter for its whole generation, or (a ``RowSelector``) chooses its drafter each round with its
own selector over the pool: one state a row, as a row is a query (each row's selector is reset when the row starts
and updated with the row's own feedback after each round, as the single-query loop updates it); a row's selector
chooses one arm a round, or a route between two (the router: its first drafter's draft plays when its match is long
enough, else the other drafter drafts instead, resolved by the loop's own ``round_members``); a tree or a plan is
refused (the batch verifies one chain a row). A selector that
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

from specbench.decoding.certify import deciders
from specbench.decoding.drafter import DecodeContext, Draft, Drafter, keep_tokens
from specbench.decoding.loop import DecodeSpec, Generation
from specbench.decoding.rounds import round_members
from specbench.decoding.sampling import logits_to_probs
from specbench.decoding.tree import chain_outcomes
from specbench.decoding.verify import block_divergence, verify_greedy, verify_sampling
from specbench.errors import SpecbenchError
from specbench.models.batched import BatchedLM
from specbench.records import Round
from specbench.selection.base import Route, Selector, feedback_of

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
    route: Route | None = None  # this round's route (a router's choice), resolved as the row drafts

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
        return cls(list(prompt), pool, player.name, query, gen)

    def begin(self, embedding: torch.Tensor | None) -> None:
        """The row starts: its selector is reset, after its prompt's embedding where it chooses by one."""
        if self.selector is None:
            return
        if self.selector.embedding_pooling is not None:
            self.selector.set_embedding(embedding)
        self.selector.reset()

    def choose(self) -> None:
        """This round's arm: the row's selector's choice (one arm, or a route between two, resolved as the row
        drafts: ``_route``), or its one drafter."""
        if self.selector is None:
            return
        arm = self.selector.select()
        self.route = arm if isinstance(arm, Route) and isinstance(arm.then, str) else None
        if self.route is not None and {arm.first, arm.then} <= set(self.pool):
            self.arm = arm.first
            return
        if not isinstance(arm, str) or arm not in self.pool:
            raise _one_arm(self.selector, repr(arm), self.pool)
        self.arm = arm

    def learn(self, rnd: Round, made: Draft) -> None:
        if self.selector is None:
            return
        self.selector.update(rnd.arm, feedback_of(rnd, chain_outcomes(len(made.tokens), rnd.accepted)))


def _begin(lm: BatchedLM, rows: list[_Row]) -> tuple[int, ...]:
    """Prefill every row, with its prompt's embedding where its selector chooses by one and the target's states at
    its cached positions where its drafters read them (heads), and start its selector; the layers whose states every
    round records."""
    layers = tuple(sorted({layer for r in rows for d in r.pool.values() for layer in d.state_layers(False)}))
    started = lm.start([r.tokens for r in rows], _pooling(rows), layers)
    for i, row in enumerate(rows):
        row.begin(None if started.embeddings is None else started.embeddings[i])
        if layers:
            row.query.record_states(started.states[i], rows=len(row.tokens) - 1, start=0)
    return layers


def _pooling(rows: list[_Row]) -> str | None:
    """The pooling of the prompt embeddings the rows' selectors choose by (read off the batch's prefill), or None."""
    poolings = {r.selector.embedding_pooling for r in rows if r.selector is not None} - {None}
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
    among them. A row selector that builds token trees is refused first."""
    named = []
    for player in players:
        if isinstance(player, RowSelector):
            if getattr(player.selector, "trees", False):
                raise _one_arm(player.selector, "token trees", player.pool)
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
        f"a row's selector ({type(selector).__name__}) chooses {chose}: in a batch a row plays one drafter of its "
        f"pool a round ({', '.join(pool)})",
        "use a selector that chooses one arm a round (bandits) in a batch, or decoding.batch_size=1",
    )


def check_batchable(spec: DecodeSpec) -> None:
    """Refuse, before any forward, a decoding a batch cannot do yet (naming it and the fix); a drafter that cannot
    draft per row is refused by its ``for_row`` as the rows are made."""
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
    drafters: Sequence[Drafter | RowSelector],
    prompts: Sequence[list[int]],
    spec: DecodeSpec,
    rng: torch.Generator,
    budget: BatchBudget | None = None,
) -> BatchResult:
    """Decode every prompt (row ``i`` drafting with ``drafters[i]``, or choosing each round with its ``RowSelector``)
    in one batch, each round's drafts cut to ``budget``'s cap when one is given: see the module's docstring."""
    if len(drafters) != len(prompts) or not prompts:
        raise ValueError(
            f"{len(prompts)} prompts and {len(drafters)} drafters: one drafter a prompt, at least one"
        )
    if budget is not None and any(
        isinstance(d, RowSelector) and getattr(d.selector, "routes", False) for d in drafters
    ):
        raise ValueError(
            "the batch budget bounds each row's drafter before it drafts: no routes under a budget"
        )
    check_batchable(spec)
    clock = spec.clock
    rows = [_Row.make(p, d, pool, spec) for p, d, pool in zip(prompts, drafters, _pools(drafters, prompts))]
    start = clock.boundary()
    layers = _begin(lm, rows)
    active, forwards = list(rows), 0
    while active:
        for row in active:
            row.choose()
        made, sizes, t_draft = _drafts(active, spec, rng, budget)
        drafts, plan = _cap(active, made, budget)
        t0 = clock.now()
        logits = lm.score([row.tokens[-1:] + d.tokens for row, d in zip(active, drafts)], layers)
        share = (clock.now() - t0) / len(active)
        forwards += 1
        kept, going = [], []
        for i, row in enumerate(active):
            scored = logits[i, : len(drafts[i].tokens) + 1]
            accepted, done = _commit(row, drafts[i], sizes[i], scored, spec, (t_draft[i], share), rng)
            if plan is not None:
                expected, predicted = plan
                row.gen.rounds[-1] = replace(row.gen.rounds[-1], expected=expected[i], predicted_s=predicted)
                budget.observe(row.arm, drafts[i], accepted)
            row.learn(row.gen.rounds[-1], drafts[i])
            kept.append(1 + accepted)
            if layers and not done:  # rows of the last committed token and the accepted draft tokens
                at = len(row.tokens) - (accepted + 1) - 1
                row.query.record_states(
                    {k: x[i] for k, x in lm.last_states.items()}, rows=accepted + 1, start=at
                )
            if done:
                row.gen.seconds = clock.now() - start
                for drafter in row.pool.values():
                    drafter.finish()
            else:
                going.append(i)
        lm.keep(kept)
        if len(going) < len(active):
            if going:
                lm.drop(going)
            active = [active[i] for i in going]
    seconds = clock.boundary() - start
    return BatchResult([r.gen for r in rows], seconds, forwards)


def _drafts(active: list[_Row], spec: DecodeSpec, rng: torch.Generator, budget: BatchBudget | None):
    """Every row's ``(draft, tokens asked for, seconds)`` this round; none drafts when the budget says, before any
    row drafts, that no cap could pay this round (``BatchBudget.may_draft``): its plan would cut every draft to
    nothing, so skipping the drafting changes no decision and saves its time. Rows whose drafter drafts many rows in
    one forward (``Drafter.shared_rows``) draft together, each timed at its share of their drafting."""
    asked = [_asked(row, spec) for row in active]
    made, seconds = [Draft([], None)] * len(active), [0.0] * len(active)
    if budget is not None and not budget.may_draft(
        [(r.arm, k, r.drafter.scored) for r, k in zip(active, asked)]
    ):
        return made, asked, seconds
    together: dict[int, list[int]] = {}
    for i, (row, k) in enumerate(zip(active, asked)):
        if row.route is not None:
            made[i], asked[i], seconds[i] = _route(row, spec, rng)
        elif k > 0 and row.drafter.shared_rows is not None:
            together.setdefault(id(row.drafter.shared_rows), []).append(i)
        elif k > 0:
            made[i], seconds[i] = _draft(row, k, spec, rng)
    clock = spec.clock
    for rows in together.values():
        t0 = clock.now()
        shared = active[rows[0]].drafter.shared_rows
        drafts = shared.propose(
            [active[i].drafter for i in rows],
            [active[i].tokens for i in rows],
            [asked[i] for i in rows],
            spec.sampling,
            rng,
            spec.eos_ids,
        )
        share = (clock.now() - t0) / len(rows)
        for i, d in zip(rows, drafts):
            made[i], seconds[i] = keep_tokens(d, range(min(asked[i], len(d.tokens)))), share
    return made, asked, seconds


def _asked(row: _Row, spec: DecodeSpec) -> int:
    """The tokens the row's drafter is asked for this round: its draft length, no more than the room its
    ``max_new_tokens`` leaves beside the bonus token (the round's ``n_max``); 0 for an arm that drafts nothing."""
    limits = spec.limits
    room = limits.max_new_tokens - len(row.gen.tokens) - 1
    return max(min(row.drafter.draft_length or limits.draft_length, room), 0) if row.drafter.drafts else 0


def _draft(row: _Row, k: int, spec: DecodeSpec, rng: torch.Generator) -> tuple[Draft, float]:
    """The row's draft of at most ``k`` tokens this round (a chain: a tree's first path) and its seconds."""
    made, seconds = _proposed(row, k, spec, rng)
    return _chain(made, k), seconds


def _proposed(row: _Row, k: int, spec: DecodeSpec, rng: torch.Generator) -> tuple[Draft, float]:
    """The row's drafter synced and its draft of ``k`` tokens as it made it (a tree stays a tree), with its seconds."""
    clock = spec.clock
    t0 = clock.now()
    row.drafter.sync(row.query, row.tokens)
    made = row.drafter.propose(row.tokens, k, spec.sampling, rng, spec.eos_ids) if k > 0 else Draft([], None)
    return made, clock.now() - t0


def _chain(made: Draft, k: int) -> Draft:
    chain = first_path(made)
    return keep_tokens(chain, range(min(k, len(chain.tokens))))


@dataclass(frozen=True)
class _Made:
    draft: Draft  # as the drafter made it
    k: int
    seconds: float


def _route(row: _Row, spec: DecodeSpec, rng: torch.Generator) -> tuple[Draft, int, float]:
    """A routed row's round, resolved as the single-query loop resolves it (``round_members``): the route's first
    drafter drafts, and its draft plays when its match (and expected tokens, with ``min_expected``) is long enough,
    else the route's other drafter drafts instead; the row's arm is the one that plays. Its chain, its length limit
    and the seconds of both drafts (a draft routed away still took its time)."""

    def draft_with(name: str) -> _Made:
        row.arm = name
        k = _asked(row, spec)
        made, seconds = _proposed(row, k, spec, rng)
        return _Made(made, k, seconds)

    members, made, unused = round_members(
        row.route,
        draft_with,
        lambda d, n: bool(d.draft.tokens) and (d.draft.match or 0) >= n,
        type(row.selector).__name__,
    )
    row.arm = members[0]
    played = made[row.arm]
    return _chain(played.draft, played.k), played.k, played.seconds + (unused.seconds if unused else 0.0)


def _cap(active: list[_Row], made: Sequence[Draft], budget: BatchBudget | None):
    """Each row's draft this round: whole, or cut to the budget's cap, with the budget's plan ``(each row's
    expected accepted tokens, each row's share of the predicted seconds)``."""
    if budget is None:
        return list(made), None
    for row, d in zip(active, made):
        if d.scores is not None and not row.drafter.scored:
            raise SpecbenchError(
                f"drafter {row.arm!r} ({type(row.drafter).__name__}) drafted with scores but does not declare "
                "scored = True: the batch budget bounds its acceptance before it drafts by its depth alone",
                f"set scored = True on {type(row.drafter).__name__} (its drafts carry Draft.scores)",
            )
    cap, expected, seconds = budget.plan([(row.arm, d) for row, d in zip(active, made)])
    cut = [keep_tokens(d, range(min(cap, len(d.tokens)))) for d in made]
    return cut, (expected, seconds / len(active))


def _commit(row: _Row, made: Draft, n_max: int, logits, spec: DecodeSpec, times, rng) -> tuple[int, bool]:
    """The row's verdict (greedy, or speculative sampling) appended (cut after an EOS) and its round recorded:
    (accepted, done)."""
    draft = list(made.tokens)
    if spec.sampling.greedy:
        verdict = verify_greedy(draft, logits)
        p = logits_to_probs(logits[: len(draft)], spec.sampling) if draft else None
    else:
        p = logits_to_probs(logits, spec.sampling)
        verdict = verify_sampling(draft, made.probs, p, rng)
    new = verdict.tokens
    stop = next((i for i, tok in enumerate(new) if tok in spec.eos_ids), None)
    if stop is not None:
        new = new[: stop + 1]
        row.gen.stop = "eos"
    gen = row.gen
    gen.rounds.append(
        Round(
            index=len(gen.rounds),
            arm=row.arm,
            drafted=len(draft),
            accepted=verdict.accepted,
            n_max=n_max,
            be=verdict.accepted / n_max if n_max else 0.0,
            bd=block_divergence(draft, made.probs, p, n_max) if draft else 0.0,
            emitted=len(new),
            t_select=0.0,
            t_draft=times[0],
            t_verify=times[1],
            t_switch=0.0,
            switched=bool(gen.rounds) and gen.rounds[-1].arm != row.arm,
        )
    )
    if gen.deciders is not None:  # greedy: the rows that chose them, a fork's margins (certify)
        gen.deciders.extend(deciders(logits, len(new)))
    gen.tokens.extend(new)
    gen.target_calls += 1
    row.tokens.extend(new)
    return verdict.accepted, gen.stop == "eos" or len(gen.tokens) >= spec.limits.max_new_tokens


__all__ = ["BatchResult", "RowSelector", "check_batchable", "decode_batch", "first_path"]
