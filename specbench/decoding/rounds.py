"""One speculative round, in steps: ``draft`` (the selector's choice -> the members' drafts), ``verify`` (chain,
tree or cascade -> a ``Verified``), ``commit`` (EOS, deciders, the target's cache and recorded states), then
``feedback`` (the ``Round`` record and the selector's update). ``decode`` (``loop.py``) is a short loop over
``play_round``; the replay (``replay.py``) resolves a choice with the same ``round_members``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import torch

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
from specbench.decoding.verify import block_divergence, block_efficiency, verify_greedy, verify_sampling
from specbench.errors import SpecbenchError
from specbench.models.target import Target
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
    Shared by the loop and its replay (``decoding/replay.py``), so both resolve a choice alike.
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


def _cut(made: Drafted, keep) -> Drafted:
    return replace(made, draft=keep_tokens(made.draft, keep))


def tree_label(members) -> str:
    """The ``arm`` a tree round is recorded under: ``tree:<a>+<b>...``."""
    return "tree:" + "+".join(members)


@dataclass
class Walk:
    """One decode call's state across its rounds: who plays (target, pool, selector), how (``spec``, ``rng``), what
    the drafters see (``ctx``), which target layers are recorded and who watches them, and the generation so far."""

    target: Target
    pool: Mapping[str, Drafter]
    selector: Selector
    spec: object  # loop.DecodeSpec
    rng: torch.Generator
    ctx: DecodeContext
    layers: tuple[int, ...]
    watching: dict[str, Drafter]
    gen: object  # loop.Generation
    t_reset: float = 0.0
    prev_members: tuple[str, ...] | None = None

    @property
    def lossy(self) -> bool:
        return self.spec.cascade is not None and not self.spec.cascade.lossless

    @property
    def certify(self) -> bool:
        return self.spec.sampling.greedy and not self.lossy


@dataclass
class Verified:
    """What one verification forward decided: the round's ``arm`` label, its output tokens (``new``), the kept draft
    tokens (``accepted``), the verified tree (None for a chain) and its verdict, the forward's rows along the
    accepted path (``logits`` with the bonus row, ``p`` at the drafted positions, ``states``), the scored draft
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


def matched(made: Drafted, min_match: int) -> bool:
    """Whether a route's first draft plays alone: it drafted and matched at least ``min_match`` tokens of context
    (``round_members``' ``plays`` for the loop and a batch's rows)."""
    return bool(made.draft.tokens) and (made.draft.match or 0) >= min_match


def draft(w: Walk, choice, room: int) -> tuple[tuple[str, ...], dict[str, Drafted], Drafted | None]:
    """The members of the round and their drafts (``round_members``), each synced then proposing up to its draft
    length (no more than ``room``); the routed-away draft, if any."""
    sampling, clock, cascade, lossy = w.spec.sampling, w.spec.clock, w.spec.cascade, w.lossy

    def draft_with(name: str) -> Drafted:
        drafter = w.pool[name]
        k = min(drafter.draft_length or w.spec.limits.draft_length, room)
        ta = clock.now()
        first = drafter.sync(w.ctx, w.target.tokens) and drafter.drafts
        tb = clock.now()
        # A lossy cascade rule may keep the last draft token too, so it drafts one token more (in the
        # bonus token's room) and the target scores all but that one: a round whose drafts are all kept
        # emits only drafter tokens, and at a never-deferring alpha the output is the drafter's own.
        n = k + 1 if lossy else k
        # a sequential cascade stops drafting where it defers: the target's row after the draft gives that token
        stop = {"stop_below": cascade.stop_below} if lossy and cascade.sequential else {}
        made = (
            drafter.propose(w.target.tokens, n, sampling, w.rng, w.spec.eos_ids, **stop)
            if n > 0
            else Draft([], None)
        )
        if stop:
            made = cascade.cut(made)
        return Drafted(made, k, n if drafter.drafts else 0, first, tb - ta, clock.now() - tb)

    return round_members(
        choice,
        draft_with,
        matched,
        type(w.selector).__name__,
        cut=_cut,
        greedy=sampling.greedy,
    )


def verify(w: Walk, members: tuple[str, ...], made: Mapping[str, Drafted]) -> Verified:
    """One target forward over the round's draft (a chain) or drafts (a token tree), and its verdict."""
    if len(members) == 1 and not made[members[0]].draft.is_tree:
        return verify_chain(w, members[0], made[members[0]])
    if w.lossy:  # a selector that returns several arms without declaring ``trees``, or a tree draft
        raise cascade_with_tree(type(w.selector).__name__ if len(members) > 1 else f"drafter '{members[0]}'")
    return verify_tree(w, members, made)


def verify_chain(w: Walk, arm: str, made: Drafted) -> Verified:
    sampling, cascade, rng = w.spec.sampling, w.spec.cascade, w.rng
    draft, k = made.draft, made.k
    scored = draft.tokens[:k]  # [k + 1, V] logits: a bonus row unless the draft has k + 1 tokens
    scores = w.target.score(scored, layers=w.layers)
    logits = scores.logits
    deferred = len(draft.tokens) if cascade is not None else 0
    if w.lossy and draft.tokens:
        verdict, deferred = cascade.verify(draft.tokens, draft.probs, draft.raw, logits, sampling, rng)
        p = logits_to_probs(logits, sampling)
    elif sampling.greedy:
        verdict = verify_greedy(draft.tokens, logits)
        p = logits_to_probs(logits[: len(draft.tokens)], sampling) if draft.tokens else None
    else:
        p = logits_to_probs(logits, sampling)
        verdict = verify_sampling(draft.tokens, draft.probs, p, rng)
    if w.lossy and cascade.sequential:  # it defers where its draft stopped short: the target gives that token
        deferred = int(len(draft.tokens) <= k)
    bd = block_divergence(draft.tokens, draft.probs, p, made.n_max) if draft.tokens else 0.0
    return Verified(arm, verdict.tokens, verdict, logits, p, scores.states, scored, made.n_max, bd, deferred)


def verify_tree(w: Walk, members: tuple[str, ...], made: Mapping[str, Drafted]) -> Verified:
    sampling = w.spec.sampling
    tree = build_tree({m: made[m].draft.tokens for m in members}, {m: made[m].draft.parents for m in members})
    scores = w.target.score_tree(tree, layers=w.layers)
    logits = scores.logits
    p_all = logits_to_probs(logits, sampling)
    if sampling.greedy:
        tv = verify_tree_greedy(tree, logits)
    else:
        tv = verify_tree_sampling(tree, {m: made[m].draft.probs for m in members}, p_all, w.rng)
    rows = tree.rows(tv.path)
    mine = {m: member_divergence(tree, m, made[m].draft.probs, p_all, made[m].n_max) for m in members}
    return Verified(
        tree_label(members) if len(members) > 1 else members[0],
        tv.tokens,
        tv,
        logits[rows],
        p_all[rows[:-1]],
        {layer: x[rows] for layer, x in scores.states.items()},
        [tree.tokens[n] for n in tv.path],
        max(d.n_max for d in made.values()),
        max(mine.values()),
        tree=tree,
        mine=mine,
    )


def commit(w: Walk, v: Verified) -> bool:
    """Cut the output at EOS, certify it, append it, and move the target (and the recorded states) past it; True
    when the generation is done."""
    gen, target = w.gen, w.target
    for i, tok in enumerate(v.new):
        if tok in w.spec.eos_ids:
            v.new = v.new[: i + 1]
            gen.stop = "eos"
            break
    if w.certify:  # row i of the forward (along the accepted path) chose output token i of the round
        gen.deciders.extend(deciders(v.logits, len(v.new)))
    last = len(target.tokens) - 1  # position of the last committed token: the first scored row
    gen.tokens.extend(v.new)
    done = gen.stop == "eos" or len(gen.tokens) >= w.spec.limits.max_new_tokens
    if not done:
        if v.tree is None:
            target.commit(v.new)
        else:
            target.commit_tree(v.verdict.path, v.new)
        if w.layers:  # rows of the last committed token and the accepted draft tokens
            w.ctx.record_states(v.states, rows=len(v.new), start=last)
    return done


def side_observations(w: Walk, v: Verified, members, context: list[int], room: int) -> dict[str, float]:
    """Under full information: what each watching drafter outside the round would have had (``observations``)."""
    if not (w.watching and w.selector.full_information):
        return {}
    limits = w.spec.limits
    seen = Verification(
        draft=v.path_draft,
        p=v.p,
        accepted=v.accepted,
        played=v.arm,
        sampling=w.spec.sampling,
        states=v.states,
        context=context,
        query=w.ctx,
        draft_length=limits.draft_length,
        room=room,
        eos_ids=w.spec.eos_ids,
    )
    return {
        name: obs
        for name, obs in observations(w.watching, seen).items()  # each group's work once
        if obs is not None and name not in members
    }


def feedback(w: Walk, choice, members, made: Mapping[str, Drafted], v: Verified, times: dict) -> Round:
    """The round's record, and the selector's update from it (each member's own feedback after a tree round)."""
    switched = w.prev_members is not None and members != w.prev_members
    first_use = any(d.first for d in made.values())
    setup = switched or first_use
    t_sync = sum(d.t_sync for d in made.values())
    t_draft = sum(d.t_propose for d in made.values()) + times["routed"] + (0.0 if setup else t_sync)
    accepted = v.accepted
    rnd = Round(
        index=len(w.gen.rounds),
        arm=v.arm,
        drafted=v.tree.size if v.tree is not None else len(made[v.arm].draft.tokens),
        accepted=accepted,
        n_max=v.n_max,
        be=block_efficiency(accepted, v.n_max),
        bd=v.bd,
        emitted=len(v.new),
        t_select=times["select"],
        t_draft=t_draft,
        t_verify=times["verify"],
        t_switch=t_sync if setup else 0.0,
        switched=switched,
        first_use=first_use,
        deferred=v.deferred,
    )
    if isinstance(choice, Plan):
        rnd.expected, rnd.predicted_s = choice.estimate()
    if v.tree is not None:  # a tree round, of several drafters' drafts or of one drafter's own tree
        rnd.tree_size = v.tree.size
    learn(w.selector, rnd, members, made, v)
    return rnd


def learn(selector: Selector, rnd: Round, members, made: Mapping[str, Drafted], v: Verified) -> None:
    """The selector's update from the round: each member's own feedback after a tree of several drafters'
    drafts (``update_tree``), else the arm's; each with the outcomes of its judged nodes (shared by the loop and
    a batch's tree rows, ``decoding/batch.py``)."""
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


def play_round(w: Walk) -> bool:
    """One round: choose, draft, verify, commit, observe, learn. True when the generation is done."""
    clock, gen = w.spec.clock, w.gen
    t0 = clock.now()
    choice = w.selector.select()
    t1 = clock.now()
    room = w.spec.limits.max_new_tokens - len(gen.tokens) - 1  # room for the bonus token: never overshoot
    members, made, unused = draft(w, choice, room)
    t3 = clock.now()
    v = verify(w, members, made)
    # the committed tokens before the round (what a watching drafter replays the round from)
    context = list(w.target.tokens) if w.watching and w.selector.full_information else []
    done = commit(w, v)
    t4 = clock.now()
    side = side_observations(w, v, members, context, room)
    t5 = clock.now()
    routed = unused.t_sync + unused.t_propose if unused is not None else 0.0
    # what the drafting phase spent outside the drafters (a plan's own decisions): the selector's time
    planning = max((t3 - t1) - routed - sum(d.t_sync + d.t_propose for d in made.values()), 0.0)
    times = {
        "select": (t1 - t0) + planning + (t5 - t4) + (0.0 if gen.rounds else w.t_reset),
        "verify": t4 - t3,
        "routed": routed,
    }
    gen.rounds.append(feedback(w, choice, members, made, v, times))
    for name, side_bd in side.items():
        w.selector.observe(name, side_bd)
    w.prev_members = members
    return done
