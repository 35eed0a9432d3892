"""One row's speculative round, in steps, shared by every batch size: ``choose`` (the row's selector picks),
``draft`` (its choice -> the members' drafts), ``scored`` (what the verification forward feeds for the row: a chain,
or a token tree), ``judge`` (the row's rows of that forward -> a ``Verified``: chain, tree or cascade verdict),
``commit`` (one end-of-sequence cut, the deciders, the committed tokens and recorded states, and the cache slots the
row keeps), then ``record`` (the one ``Round`` record) and ``learn`` (the selector's update). The engine
(``engine.py``) runs them for every row in flight around one forward; ``decode`` (``loop.py``) is its batch of one; the
replay (``replay.py``) resolves a choice with the same ``round_members`` and records a round with the same
``round_record``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import torch

from specbench.decoding.acceptance import rule as acceptance_rule
from specbench.decoding.certify import deciders
from specbench.decoding.drafter import DecodeContext, Draft, Drafter, Verification, keep_tokens, observations
from specbench.decoding.sampling import logits_to_probs
from specbench.decoding.tree import (
    TokenTree,
    build_tree,
    chain_outcomes,
    draw_outcomes,
    member_divergence,
    verify_tree_greedy,
    verify_tree_sampling,
)
from specbench.decoding.verify import block_divergence, block_efficiency, verify_greedy
from specbench.errors import SpecbenchError
from specbench.models.cache import common_prefix
from specbench.records import Round
from specbench.selection.base import Feedback, Plan, Route, Selector, feedback_of


@dataclass(frozen=True)
class Drafted:
    """One member's draft in a round: the draft, its length limit ``k``, ``n_max`` (0 for the autoregressive
    arm), whether this sync started the query for it, and the sync and propose times."""

    draft: Draft
    k: int
    n_max: int
    first: bool
    t_sync: float
    t_propose: float


def cascade_with_tree(who: str) -> SpecbenchError:
    return SpecbenchError(
        f"a speculative-cascade rule verifies one draft per round, and {who} verifies several "
        "drafts as a token tree",
        "use cascade=none with tree methods, or fixed:<drafter> methods with the cascade",
    )


def expected_tokens(made) -> float:
    """A drafted member's expected accepted tokens by its own estimate: the sum of its tokens' path scores (each the
    chance its path is accepted; 0 without scores). Callers whose drafts carry no estimate cannot route by it."""
    draft = getattr(made, "draft", None)
    scores = getattr(draft, "scores", None)
    if scores is None and not isinstance(draft, Draft):
        raise SpecbenchError(
            "a route by expected accepted tokens (min_expected) needs the drafts' own scores, "
            "which this walk does not have",
            "evaluate that router live (specbench eval)",
        )
    return float(sum(scores or ()))


def round_members(
    choice,
    draft_with: Callable[[str], object],
    plays: Callable[[object, int], bool],
    who: str,
    cut: Callable[[object, object], object] | None = None,
    greedy: bool = True,
) -> tuple[tuple[str, ...], dict[str, object], object | None]:
    """A selector's choice (an arm, a tuple of arms, a ``Route``) -> the round's members, their drafts made by
    ``draft_with(name)``, and the routed-away draft (a ``Route``'s first arm, drafted but not played: its time
    still counts), or None. ``plays(drafted, min_match)``: whether a ``Route``'s first draft plays alone (and, with
    ``min_expected``, ``expected_tokens(drafted)``: its expected accepted tokens, when the caller's drafts have them).
    Shared by the engine and the replay (``decoding/replay.py``), so both resolve a choice alike.
    A ``Plan`` (a cost-model budget) drafts its ``first`` drafters, then those ``more`` names, then keeps the tokens
    ``prune`` names: ``cut(made, keep)`` cuts one member's draft (callers without ``cut`` cannot play a Plan); a
    member left with no token is dropped, its drafting time counted with the routed-away draft's."""
    if isinstance(choice, Plan):
        if cut is None:
            raise SpecbenchError(
                f"{who} builds each round from its drafters' drafts (a cost-model plan), which "
                "this walk cannot replay",
                "evaluate it live (specbench eval)",
            )
        made = {m: draft_with(m) for m in dict.fromkeys(choice.first)}
        for m in choice.more({name: d.draft for name, d in made.items()}):
            if m not in made:
                made[m] = draft_with(m)
        keep = choice.prune({name: d.draft for name, d in made.items()}, greedy)
        kept = {m: cut(d, keep.get(m, ())) for m, d in made.items()}
        members = tuple(m for m in kept if kept[m].draft.tokens) or tuple(kept)[:1]
        dropped = [d for m, d in made.items() if m not in members]
        return members, {m: kept[m] for m in members}, (_merged(dropped) if dropped else None)
    if isinstance(choice, Route):  # draft with the first arm; keep its draft only on a long enough match
        tried = draft_with(choice.first)
        if plays(tried, choice.min_match) and (
            choice.min_expected is None or expected_tokens(tried) >= choice.min_expected
        ):
            return (choice.first,), {choice.first: tried}, None
        # the fallback: one arm, or a tree (which may keep the first arm's draft, already made)
        then = (choice.then,) if isinstance(choice.then, str) else tuple(dict.fromkeys(choice.then))
        made = {m: tried if m == choice.first else draft_with(m) for m in then}
        return tuple(made), made, (None if choice.first in made else tried)
    members = (choice,) if isinstance(choice, str) else tuple(dict.fromkeys(choice))
    if not members:
        raise SpecbenchError(
            f"{who} chose no arm for a round", "a tree selector must name at least one drafter per round"
        )
    return members, {m: draft_with(m) for m in members}, None


def _merged(dropped: list) -> Drafted:
    """Drafts made and then left out of the round, as one routed-away draft (their sync and propose times)."""
    return Drafted(
        Draft([], None), 0, 0, False, sum(d.t_sync for d in dropped), sum(d.t_propose for d in dropped)
    )


def cut_draft(made: Drafted, keep) -> Drafted:
    """A member's draft cut to the token indices ``keep`` (a plan's pruning, the batch budget's cap)."""
    return replace(made, draft=keep_tokens(made.draft, keep))


def tree_label(members) -> str:
    """The ``arm`` a tree round is recorded under: ``tree:<a>+<b>...``."""
    return "tree:" + "+".join(members)


def matched(made: Drafted, min_match: int) -> bool:
    """Whether a route's first draft plays alone: it drafted and matched at least ``min_match`` tokens of context
    (``round_members``' ``plays``)."""
    return bool(made.draft.tokens) and (made.draft.match or 0) >= min_match


@dataclass
class Turn:
    """A row's round in progress: the selector's ``choice`` and the time it took, the round's members and their
    drafts, the routed-away draft, the time spent planning, the verified tree (several drafts or a tree draft;
    None: a chain), and a budget's plan of the round (expected accepted tokens, predicted seconds)."""

    choice: object
    t_select: float
    members: tuple[str, ...] = ()
    made: dict[str, Drafted] = field(default_factory=dict)
    unused: Drafted | None = None
    t_plan: float = 0.0
    tree: TokenTree | None = None
    planned: tuple[float, float] | None = None

    @property
    def routed(self) -> float:
        return self.unused.t_sync + self.unused.t_propose if self.unused is not None else 0.0


@dataclass
class Row:
    """One query in flight: who plays it (``selector`` over ``pool``: the row's own drafters), how (``spec``, whose
    limits are the row's own, and ``rng``), what its drafters see (``ctx``), the target layers recorded and who
    watches them, its committed tokens, and the generation so far."""

    selector: Selector
    pool: Mapping[str, Drafter]
    spec: object  # loop.DecodeSpec
    rng: torch.Generator
    ctx: DecodeContext
    layers: tuple[int, ...]
    watching: dict[str, Drafter]
    gen: object  # loop.Generation
    tokens: list[int]  # committed: the decoder's tokens (prompt, then output, for a decoder-only target)
    t_reset: float = 0.0
    t0: float = 0.0  # when the row joined (its prefill began): its ``seconds`` run from there
    prev_members: tuple[str, ...] | None = None
    turn: Turn | None = None

    @property
    def lossy(self) -> bool:
        return self.spec.cascade is not None and not self.spec.cascade.lossless

    @property
    def certify(self) -> bool:
        return self.spec.sampling.greedy and not self.lossy

    @property
    def room(self) -> int:
        """Draft tokens this round may have: ``max_new_tokens`` left beside the bonus token (never overshoot)."""
        return self.spec.limits.max_new_tokens - len(self.gen.tokens) - 1

    @property
    def done(self) -> bool:
        return self.gen.stop == "eos" or len(self.gen.tokens) >= self.spec.limits.max_new_tokens

    def asked(self, name: str) -> int:
        """The tokens drafter ``name`` is asked for this round: its draft length, within the room."""
        drafter = self.pool[name]
        return min(drafter.draft_length or self.spec.limits.draft_length, self.room)


def choose(row: Row) -> None:
    """The row's selector picks this round's arm, route, tree or plan (timed)."""
    clock = row.spec.clock
    t0 = clock.now()
    row.selector.at(len(row.tokens))
    choice = row.selector.select()
    row.turn = Turn(choice, clock.now() - t0)


def draft_with(row: Row, name: str) -> Drafted:
    """Member ``name`` synced with the row's committed tokens, then proposing up to its draft length (no more than
    the room); a lossy cascade drafts one token more (see below)."""
    spec, clock, cascade, lossy = row.spec, row.spec.clock, row.spec.cascade, row.lossy
    drafter = row.pool[name]
    k = row.asked(name)
    ta = clock.now()
    first = drafter.sync(row.ctx, row.tokens) and drafter.drafts
    tb = clock.now()
    # A lossy cascade rule may keep the last draft token too, so it drafts one token more (in the bonus token's
    # room) and the target scores all but that one: a round whose drafts are all kept emits only drafter tokens,
    # and at a never-deferring alpha the output is the drafter's own.
    n = k + 1 if lossy else k
    # a sequential cascade stops drafting where it defers: the target's row after the draft gives that token
    stop = {"stop_below": cascade.stop_below} if lossy and cascade.sequential else {}
    made = (
        drafter.propose(row.tokens, n, spec.sampling, row.rng, spec.eos_ids, **stop)
        if n > 0
        else Draft([], None)
    )
    if stop:
        made = cascade.cut(made)
    return Drafted(made, k, n if drafter.drafts else 0, first, tb - ta, clock.now() - tb)


def draft(row: Row) -> None:
    """The round's members and their drafts (``round_members`` over ``draft_with``), and the time the choice spent
    outside the drafters (a plan's own decisions: the selector's)."""
    clock, turn = row.spec.clock, row.turn
    t0 = clock.now()
    turn.members, turn.made, turn.unused = round_members(
        turn.choice,
        lambda name: draft_with(row, name),
        matched,
        type(row.selector).__name__,
        cut=cut_draft,
        greedy=row.spec.sampling.greedy,
    )
    spent = clock.now() - t0
    turn.t_plan = max(spent - turn.routed - sum(d.t_sync + d.t_propose for d in turn.made.values()), 0.0)


def scored(row: Row) -> tuple[list[int], TokenTree | None]:
    """What the verification forward feeds for the row: its last committed token, then its draft (a chain, the
    first ``k`` tokens) or its token tree's nodes, with the tree (None for a chain, and for a tree that is one path:
    a chain forward scores it with the same rows)."""
    turn = row.turn
    members, made = turn.members, turn.made
    if len(members) == 1 and not made[members[0]].draft.is_tree:
        one = made[members[0]]
        return [row.tokens[-1], *one.draft.tokens[: one.k]], None
    if row.lossy:  # a selector that returns several arms without declaring ``trees``, or a tree draft
        raise cascade_with_tree(
            type(row.selector).__name__ if len(members) > 1 else f"drafter '{members[0]}'"
        )
    turn.tree = build_tree(
        {m: made[m].draft.tokens for m in members}, {m: made[m].draft.parents for m in members}
    )
    nodes = [row.tokens[-1], *turn.tree.tokens]
    return nodes, (None if turn.tree.is_chain else turn.tree)


@dataclass
class Verified:
    """What one verification forward decided for a row: the round's ``arm`` label, its output tokens (``new``), the
    kept draft tokens (``accepted``), the verified tree (None for a chain) and its verdict, the forward's rows along
    the accepted path (``logits`` with the bonus row, ``p`` at the drafted positions, ``states``), the scored draft
    along that path, ``n_max``, Block Divergence (the round's and each tree member's), deferred positions."""

    arm: str
    new: list[int]
    verdict: object
    logits: torch.Tensor
    p: torch.Tensor | None
    states: dict[int, torch.Tensor]
    path_draft: list[int]
    n_max: int
    bd: float
    deferred: int = 0
    tree: TokenTree | None = None
    mine: dict[str, float] = field(default_factory=dict)

    @property
    def accepted(self) -> int:
        return min(self.verdict.accepted, len(self.new))


def judge(row: Row, logits: torch.Tensor, states: Mapping[int, torch.Tensor]) -> Verified:
    """The row's verdict from its rows of the forward (``logits`` ``[n + 1, V]``, ``states``): a chain's (greedy,
    speculative sampling, or a cascade rule's) or a token tree's."""
    turn = row.turn
    if turn.tree is not None:
        return _judge_tree(row, logits, states)
    arm = turn.members[0]
    made = turn.made[arm]
    sampling, cascade, rng = row.spec.sampling, row.spec.cascade, row.rng
    draft, k = made.draft, made.k
    path = draft.tokens[:k]  # [k + 1, V] logits: a bonus row unless the draft has k + 1 tokens
    deferred = len(draft.tokens) if cascade is not None else 0
    if row.lossy and draft.tokens:
        verdict, deferred = cascade.verify(draft.tokens, draft.probs, draft.raw, logits, sampling, rng)
        p = logits_to_probs(logits, sampling)
    elif sampling.greedy:
        verdict = verify_greedy(draft.tokens, logits)
        p = logits_to_probs(logits[: len(draft.tokens)], sampling) if draft.tokens else None
    else:
        p = logits_to_probs(logits, sampling)
        verdict = acceptance_rule(sampling.acceptance)(draft.tokens, draft.probs, p, rng)
    if (
        row.lossy and cascade.sequential
    ):  # it defers where its draft stopped short: the target gives that token
        deferred = int(len(draft.tokens) <= k)
    bd = block_divergence(draft.tokens, draft.probs, p, made.n_max) if draft.tokens else 0.0
    return Verified(arm, verdict.tokens, verdict, logits, p, dict(states), path, made.n_max, bd, deferred)


def _judge_tree(row: Row, logits: torch.Tensor, states: Mapping[int, torch.Tensor]) -> Verified:
    turn, sampling = row.turn, row.spec.sampling
    if not sampling.greedy and sampling.acceptance != "full":
        raise SpecbenchError(
            f"decoding.acceptance={sampling.acceptance} is defined for chains; this round verifies a token tree",
            "use decoding.acceptance=full with tree methods and tree drafters (or a chain drafter)",
        )
    tree, made, members = turn.tree, turn.made, turn.members
    p_all = logits_to_probs(logits, sampling)
    if sampling.greedy:
        tv = verify_tree_greedy(tree, logits)
    else:
        tv = verify_tree_sampling(tree, {m: made[m].draft.probs for m in members}, p_all, row.rng)
    rows = tree.rows(tv.path)
    mine = {m: member_divergence(tree, m, made[m].draft.probs, p_all, made[m].n_max) for m in members}
    return Verified(
        tree_label(members) if len(members) > 1 else members[0],
        tv.tokens,
        tv,
        logits[rows],
        p_all[rows[:-1]],
        {layer: x[rows] for layer, x in states.items()},
        [tree.tokens[n] for n in tv.path],
        max(d.n_max for d in made.values()),
        max(mine.values()),
        tree=tree,
        mine=mine,
    )


def commit(row: Row, v: Verified) -> list[int]:
    """Cut the output after an EOS (kept), certify it, append it, and record the target's states at the committed
    positions; the offsets of the forward's inputs the row's cache keeps (its last committed token and the accepted
    draft tokens, or a tree's root and accepted path)."""
    gen = row.gen
    for i, tok in enumerate(v.new):
        if tok in row.spec.eos_ids:
            v.new = v.new[: i + 1]
            gen.stop = "eos"
            break
    if row.certify:  # row i of the forward (along the accepted path) chose output token i of the round
        gen.deciders.extend(deciders(v.logits, len(v.new)))
    last = len(row.tokens) - 1  # position of the last committed token: the first scored row
    gen.tokens.extend(v.new)
    gen.target_calls += 1
    if (
        row.layers
    ):  # rows of the last committed token and the accepted draft tokens (as the target's cache keeps)
        row.ctx.record_states(v.states, rows=len(v.new), start=last)
    row.tokens.extend(v.new)
    if v.tree is not None:
        return v.tree.rows(v.verdict.path)
    # what the cache holds after the round: the committed tokens but the last (a cascade may emit a drafter token
    # past the scored ones, which the next forward feeds)
    return list(range(1 + min(common_prefix(v.path_draft, v.new), len(v.new) - 1)))


def side_observations(row: Row, v: Verified, context: list[int]) -> dict[str, float]:
    """Under full information: what each watching drafter outside the round would have had (``observations``)."""
    if not (row.watching and row.selector.full_information):
        return {}
    limits = row.spec.limits
    seen = Verification(
        draft=v.path_draft,
        p=v.p,
        accepted=v.accepted,
        played=v.arm,
        sampling=row.spec.sampling,
        states=v.states,
        context=context,
        query=row.ctx,
        draft_length=limits.draft_length,
        room=limits.max_new_tokens - (len(row.gen.tokens) - len(v.new)) - 1,
        eos_ids=row.spec.eos_ids,
    )
    return {
        name: obs
        for name, obs in observations(row.watching, seen).items()  # each group's work once
        if obs is not None and name not in row.turn.members
    }


@dataclass(frozen=True)
class Counts:
    """What a round drafted, accepted and emitted, its draft length limit and Block Divergence."""

    drafted: int
    accepted: int
    n_max: int
    bd: float
    emitted: int


def round_record(
    index: int,
    arm: str,
    counts: Counts,
    made: Mapping[str, object],
    routed: float,
    switched: bool,
    times: tuple[float, float],
    switch_overhead: float = 0.0,
) -> Round:
    """The one ``Round`` record of a round, live or replayed (``times``: its ``t_select`` and ``t_verify``): a switch or
    a member's first use in the query books the members' catch-up as ``t_switch`` (plus ``switch_overhead`` on a
    switch that is not a first use: what a replay adds for a live switch), else it is drafting; ``routed`` (a
    routed-away or pruned draft) is drafting."""
    drafted, accepted, n_max, bd, emitted = (
        counts.drafted,
        counts.accepted,
        counts.n_max,
        counts.bd,
        counts.emitted,
    )
    t_select, t_verify = times
    first_use = any(d.first for d in made.values())
    setup = switched or first_use
    t_sync = sum(d.t_sync for d in made.values())
    t_draft = sum(d.t_propose for d in made.values()) + routed + (0.0 if setup else t_sync)
    if switched and not first_use:
        t_sync += switch_overhead
    return Round(
        index=index,
        arm=arm,
        drafted=drafted,
        accepted=accepted,
        n_max=n_max,
        be=block_efficiency(accepted, n_max),
        bd=bd,
        emitted=emitted,
        t_select=t_select,
        t_draft=t_draft,
        t_verify=t_verify,
        t_switch=t_sync if setup else 0.0,
        switched=switched,
        first_use=first_use,
    )


def record(row: Row, v: Verified, t_select: float, t_verify: float, forward: int | None) -> Round:
    """The row's round record (``round_record``), with what a cascade deferred, a tree's size, a plan's estimates
    and the forward that verified it, appended to its generation."""
    turn, gen = row.turn, row.gen
    switched = row.prev_members is not None and turn.members != row.prev_members
    drafted = v.tree.size if v.tree is not None else len(turn.made[v.arm].draft.tokens)
    counts = Counts(drafted, v.accepted, v.n_max, v.bd, len(v.new))
    rnd = round_record(len(gen.rounds), v.arm, counts, turn.made, turn.routed, switched, (t_select, t_verify))
    rnd.deferred, rnd.forward = v.deferred, forward
    if isinstance(turn.choice, Plan):
        rnd.expected, rnd.predicted_s = turn.choice.estimate()
        rnd.context, rnd.decided = len(row.tokens) - len(v.new), turn.choice.label
    elif turn.planned is not None:
        rnd.expected, rnd.predicted_s = turn.planned
    if v.tree is not None:  # a tree round, of several drafters' drafts or of one drafter's own tree
        rnd.tree_size = v.tree.size
    gen.rounds.append(rnd)
    row.prev_members = turn.members
    return rnd


def learn(
    selector: Selector, rnd: Round, members, made: Mapping[str, Drafted], v: Verified, choice: object = None
) -> None:
    """The selector's update from the round: each member's own feedback after a tree of several drafters' drafts
    (``update_tree``), else the arm's; each with the outcomes of its judged nodes; a ``Plan`` (``choice``) then
    settles with the measured round."""
    accepted = rnd.accepted
    if v.tree is None:
        nodes = {v.arm: chain_outcomes(len(made[v.arm].draft.tokens), accepted)}
    else:
        nodes = {m: draw_outcomes(v.tree, m, v.verdict.path) for m in members}
    if v.tree is not None and len(members) > 1:
        own = {m: min(v.verdict.agreement(v.tree, m), accepted) for m in members}
        rnd.members, rnd.tree_size = list(members), v.tree.size
        rnd.member_accepted, rnd.winners = own, v.verdict.winners(v.tree)
        selector.update_tree(
            {
                m: Feedback(
                    drafted=len(made[m].draft.tokens),
                    accepted=own[m],
                    n_max=made[m].n_max,
                    be=block_efficiency(own[m], made[m].n_max),
                    bd=v.mine[m],
                    t_draft=made[m].t_propose,
                    t_verify=rnd.t_verify,
                    t_switch=made[m].t_sync if made[m].first else 0.0,
                    nodes=nodes[m],
                )
                for m in members
            }
        )
    else:
        selector.update(v.arm, feedback_of(rnd, nodes[v.arm]))
    if isinstance(choice, Plan) and choice.settle is not None:
        choice.settle(rnd)


__all__ = [
    "Counts",
    "Drafted",
    "Row",
    "Turn",
    "Verified",
    "cascade_with_tree",
    "choose",
    "commit",
    "cut_draft",
    "draft",
    "draft_with",
    "judge",
    "learn",
    "matched",
    "record",
    "round_members",
    "round_record",
    "scored",
    "side_observations",
    "tree_label",
]
