"""The one decode loop. Every method, autoregressive decoding included, runs through ``decode``.

The loop holds no drafter-kind-specific code: it speaks the protocol of ``decoding/drafter.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import torch

from specbench.decoding.cascade import Cascade
from specbench.decoding.certify import deciders
from specbench.decoding.drafter import Draft, Drafter, DecodeContext, Verification, keep_tokens, observations
from specbench.decoding.sampling import SamplingParams, logits_to_probs
from specbench.decoding.tree import (build_tree, chain_outcomes, draw_outcomes, member_divergence, verify_tree_greedy,
                                    verify_tree_sampling)
from specbench.decoding.verify import block_divergence, block_efficiency, verify_greedy, verify_sampling
from specbench.errors import SpecbenchError
from specbench.models.target import Target
from specbench.records import Round
from specbench.selection.base import Feedback, Plan, Route, Selector
from specbench.timing import Clock


@dataclass(frozen=True)
class Limits:
    max_new_tokens: int = 128
    draft_length: int = 4

    def __post_init__(self):
        for name, value, key in (("draft length", self.draft_length, "decoding.draft_length"),
                                 ("max_new_tokens", self.max_new_tokens, "decoding.max_new_tokens")):
            if isinstance(value, bool) or not isinstance(value, int):  # 2.9 must not run as 2
                raise SpecbenchError(f"{name} must be a whole number of tokens, got {value!r}",
                                     f"set {key} to a positive integer")
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
    # Greedy lossless decoding: per output position, the top-2 ids and logits of the row that chose it
    # (``certify.deciders``), so a fork from the autoregressive output can be judged a tie or a defect.
    deciders: list[list[float]] | None = None
    prompt_sha: str | None = None  # a fingerprint of the prompt ids (set by the session that decoded it)

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


def listeners(pool: Mapping[str, Drafter], selector: Selector) -> tuple[dict[str, Drafter], tuple[int, ...]]:
    """The drafters that watch every verification forward, and the union of the target layers they want.

    Only drafters the selector can play (``selector.playable``), or observe under full information,
    listen: a drafter that will never draft in this generation must not make the target return hidden
    states (that would be drafter work inside another method's timed region, the baseline's included).
    """
    side = selector.full_information
    reachable = set(pool) if side else set(selector.playable())
    watching = {name: d for name, d in pool.items() if name in reachable and d.state_layers(side)}
    layers = sorted({layer for d in watching.values() for layer in d.state_layers(side)})
    return watching, tuple(layers)


@dataclass(frozen=True)
class DecodeSpec:
    """How a decode call runs, apart from who plays and on what: the sampling law, the limits (new tokens,
    draft length), the EOS ids, the clock that times it, and the verification rule (``cascade``: a deferral
    rule verifying against its mixture instead of the target, lossy; ``None`` or rule ``none``: lossless)."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    limits: Limits = field(default_factory=Limits)
    eos_ids: frozenset[int] = frozenset()
    clock: Clock = field(default_factory=Clock)
    cascade: Cascade | None = None
    stream: str | None = None  # the generations this decode continues (an eval method): ``DecodeContext.stream``


@dataclass(frozen=True)
class _Drafted:
    """One member's draft in a round: the draft, its length limit ``k``, ``n_max`` (0 for the autoregressive
    arm), whether this sync started the query for it, and the sync and propose times."""

    draft: Draft
    k: int
    n_max: int
    first: bool
    t_sync: float
    t_propose: float


def check_trees(selector: Selector, target: Target, method: str | None = None) -> None:
    """Refuse, before any decoding, a selector that verifies token trees on an encoder-decoder target."""
    if selector.trees and target.is_encoder_decoder:
        what = f"method '{method}'" if method else type(selector).__name__
        raise SpecbenchError(f"{what} verifies several drafts as a token tree, which needs a decoder-only target; "
                             f"this one is encoder-decoder ({type(target.model).__name__} places decoder tokens by "
                             "cache position, not by position_ids)",
                             "use fixed:<drafter> or a bandit selector (one draft a round) with this target")


def cascade_with_tree(who: str) -> SpecbenchError:
    return SpecbenchError(f"a speculative-cascade rule verifies one draft per round, and {who} verifies several "
                          "drafts as a token tree",
                          "use cascade=none with tree methods, or fixed:<drafter> methods with the cascade")


def round_members(choice, draft_with: Callable[[str], object], plays: Callable[[object, int], bool],
                  who: str, cut: Callable[[object, object], object] | None = None
                  ) -> tuple[tuple[str, ...], dict[str, object], object | None]:
    """A selector's choice (an arm, a tuple of arms, a ``Route``) -> the round's members, their drafts made by
    ``draft_with(name)``, and the routed-away draft (a ``Route``'s first arm, drafted but not played: its time
    still counts), or None. ``plays(drafted, min_match)``: whether a ``Route``'s first draft plays alone.
    Shared by the loop and its replay (``decoding/replay.py``), so both resolve a choice alike.
    A ``Plan`` (a cost-model budget) drafts its ``first`` drafters, then those ``more`` names, then keeps the tokens
    ``prune`` names: ``cut(made, keep)`` cuts one member's draft (callers without ``cut`` cannot play a Plan); a
    member left with no token is dropped, its drafting time counted with the routed-away draft's."""
    if isinstance(choice, Plan):
        if cut is None:
            raise SpecbenchError(f"{who} builds each round from its drafters' drafts (a cost-model plan), which "
                                 "this walk cannot replay", "evaluate it live (specbench eval)")
        made = {m: draft_with(m) for m in dict.fromkeys(choice.first)}
        for m in choice.more({name: d.draft for name, d in made.items()}):
            if m not in made:
                made[m] = draft_with(m)
        keep = choice.prune({name: d.draft for name, d in made.items()})
        kept = {m: cut(d, keep.get(m, ())) for m, d in made.items()}
        members = tuple(m for m in kept if kept[m].draft.tokens) or tuple(kept)[:1]
        dropped = [d for m, d in made.items() if m not in members]
        return members, {m: kept[m] for m in members}, (_merged(dropped) if dropped else None)
    if isinstance(choice, Route):  # draft with the first arm; keep its draft only on a long enough match
        tried = draft_with(choice.first)
        if plays(tried, choice.min_match):
            return (choice.first,), {choice.first: tried}, None
        # the fallback: one arm, or a tree (which may keep the first arm's draft, already made)
        then = (choice.then,) if isinstance(choice.then, str) else tuple(dict.fromkeys(choice.then))
        made = {m: tried if m == choice.first else draft_with(m) for m in then}
        return tuple(made), made, (None if choice.first in made else tried)
    members = (choice,) if isinstance(choice, str) else tuple(dict.fromkeys(choice))
    if not members:
        raise SpecbenchError(f"{who} chose no arm for a round", "a tree selector must name at least one drafter per round")
    return members, {m: draft_with(m) for m in members}, None


def _merged(dropped: list) -> "_Drafted":
    """Drafts made and then left out of the round, as one routed-away draft (their sync and propose times)."""
    return _Drafted(Draft([], None), 0, 0, False, sum(d.t_sync for d in dropped), sum(d.t_propose for d in dropped))


def _cut(made: "_Drafted", keep) -> "_Drafted":
    return replace(made, draft=keep_tokens(made.draft, keep))


def tree_label(members) -> str:
    """The ``arm`` a tree round is recorded under: ``tree:<a>+<b>...``."""
    return "tree:" + "+".join(members)


def decode(target: Target, pool: Mapping[str, Drafter], selector: Selector, prompt_ids: list[int], spec: DecodeSpec,
           rng: torch.Generator, query=None) -> Generation:
    """Generate up to ``spec.limits.max_new_tokens`` tokens for one prompt (batch size 1), drawing every random
    choice from ``rng``.

    Each round: the selector picks an arm; its drafter catches up with the committed tokens
    (``sync``: on its first use in the query this includes its per-query setup, and when the
    previous round used another arm the catch-up is the switching cost; both are timed as
    ``t_switch``) and proposes up to ``draft_length`` tokens; one target forward scores them;
    verification keeps the accepted prefix plus one target token; the cache is rolled back to that;
    drafters that watch the target (``state_layers``) see the forward (``observe``); the selector
    gets feedback, and side observations of unplayed arms when it asks for them.
    Only the arm a round plays is touched: an autoregressive generation does no drafter work.
    Output stops after an EOS (kept, even inside an accepted draft) or at ``max_new_tokens``.
    ``seconds`` covers everything from the prefill on: one synchronising clock reading at each end
    (``clock.boundary``); per-phase times come from ``clock.now`` (synchronising on CUDA only with
    ``timing.phases``).
    With ``spec.cascade`` set, every drafted position counts as deferred under lossless verification too.
    """
    sampling, limits, eos_ids, clock, cascade = spec.sampling, spec.limits, spec.eos_ids, spec.clock, spec.cascade
    check_trees(selector, target)
    if selector.trees and cascade is not None and not cascade.lossless:
        raise cascade_with_tree(type(selector).__name__)
    watching, layers = listeners(pool, selector)
    t_start = clock.boundary()
    # A context-aware selector reads the query's embedding, taken from the prefill (timed).
    prefilled = target.prefill(prompt_ids, embedding=selector.embedding_pooling, layers=layers)
    embedding = prefilled.embedding
    t_reset = clock.now()
    if embedding is not None:
        selector.set_embedding(embedding)
    selector.reset(query)
    t_reset = clock.now() - t_reset  # the selector's per-query work, counted in the first round's t_select
    ctx = DecodeContext(encoder_ids=target.encoder_ids, encoder_outputs=target.encoder_outputs,
                side_observations=selector.full_information, stream=spec.stream)
    if layers:  # the target's states at the committed positions it has seen (all but the last token)
        ctx.record_states(prefilled.states, rows=len(target.tokens) - 1, start=0)
    out: list[int] = []
    certify = sampling.greedy and (cascade is None or cascade.lossless)
    lossy = cascade is not None and not cascade.lossless
    gen = Generation(tokens=out, deciders=[] if certify else None)
    prev_members: tuple[str, ...] | None = None
    while len(out) < limits.max_new_tokens:
        t0 = clock.now()
        choice = selector.select()
        t1 = clock.now()
        # Leave room for the bonus token so a round never overshoots max_new_tokens.
        room = limits.max_new_tokens - len(out) - 1

        def draft_with(name: str) -> _Drafted:
            drafter = pool[name]
            k = min(drafter.draft_length or limits.draft_length, room)
            ta = clock.now()
            first = drafter.sync(ctx, target.tokens) and drafter.drafts
            tb = clock.now()
            # A lossy cascade rule may keep the last draft token too, so it drafts one token more (in the
            # bonus token's room) and the target scores all but that one: a round whose drafts are all kept
            # emits only drafter tokens, and at a never-deferring alpha the output is the drafter's own.
            n = k + 1 if lossy else k
            # a sequential cascade stops drafting where it defers: the target's row after the draft gives that token
            stop = {"stop_below": cascade.stop_below} if lossy and cascade.sequential else {}
            draft = drafter.propose(target.tokens, n, sampling, rng, eos_ids, **stop) if n > 0 else Draft([], None)
            if stop:
                draft = cascade.cut(draft)
            return _Drafted(draft, k, n if drafter.drafts else 0, first, tb - ta, clock.now() - tb)

        members, made, unused = round_members(
            choice, draft_with, lambda d, n: bool(d.draft.tokens) and (d.draft.match or 0) >= n, type(selector).__name__,
            cut=_cut)
        routed_time = unused.t_sync + unused.t_propose if unused is not None else 0.0
        switched = prev_members is not None and members != prev_members
        first_use = any(d.first for d in made.values())
        t3 = clock.now()
        tree = None
        single = len(members) == 1 and not made[members[0]].draft.is_tree
        if single:
            arm = members[0]
            draft, k = made[arm].draft, made[arm].k
            scored = draft.tokens[:k]  # [k + 1, V] logits: a bonus row unless the draft has k + 1 tokens
            scores = target.score(scored, layers=layers)
            logits, states = scores.logits, scores.states
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
            if lossy and cascade.sequential:  # it defers where its draft stopped short: the target gives that token
                deferred = int(len(draft.tokens) <= k)
            new, rows, path_draft = verdict.tokens, None, scored
            n_max = made[arm].n_max
            bd = block_divergence(draft.tokens, draft.probs, p, n_max) if draft.tokens else 0.0
        else:
            if lossy:  # a selector that returns several arms without declaring ``trees``, or a tree draft
                raise cascade_with_tree(type(selector).__name__ if len(members) > 1 else f"drafter '{members[0]}'")
            arm = tree_label(members) if len(members) > 1 else members[0]
            tree = build_tree({m: made[m].draft.tokens for m in members},
                              {m: made[m].draft.parents for m in members})
            scores = target.score_tree(tree, layers=layers)
            logits, states = scores.logits, scores.states
            p_all = logits_to_probs(logits, sampling)
            if sampling.greedy:
                tv = verify_tree_greedy(tree, logits)
            else:
                tv = verify_tree_sampling(tree, {m: made[m].draft.probs for m in members}, p_all, rng)
            new, rows = tv.tokens, tree.rows(tv.path)
            path_draft = [tree.tokens[n] for n in tv.path]
            logits, p = logits[rows], p_all[rows[:-1]]
            states = {layer: x[rows] for layer, x in states.items()}
            verdict, deferred = tv, 0
            n_max = max(d.n_max for d in made.values())
            mine = {m: member_divergence(tree, m, made[m].draft.probs, p_all, made[m].n_max) for m in members}
            bd = max(mine.values())
        for i, tok in enumerate(new):
            if tok in eos_ids:
                new = new[: i + 1]
                gen.stop = "eos"
                break
        accepted = min(verdict.accepted, len(new))
        if certify:  # row i of the forward (along the accepted path) chose output token i of the round
            gen.deciders.extend(deciders(logits, len(new)))
        last = len(target.tokens) - 1  # position of the last committed token: the first scored row
        out.extend(new)
        done = gen.stop == "eos" or len(out) >= limits.max_new_tokens
        if not done:
            if tree is None:
                target.commit(new)
            else:
                target.commit_tree(verdict.path, new)
            if layers:  # rows of the last committed token and the accepted draft tokens
                ctx.record_states(states, rows=len(new), start=last)
        t4 = clock.now()
        side = {}
        if watching and selector.full_information:
            seen = Verification(draft=path_draft, p=p, accepted=accepted, played=arm, sampling=sampling, states=states,
                                context=target.tokens[: last + 1], query=ctx,
                                draft_length=limits.draft_length, room=room, eos_ids=eos_ids)
            for name, obs in observations(watching, seen).items():  # each group's work once, then every member's read
                if obs is not None and name not in members:
                    side[name] = obs
        t5 = clock.now()
        t_select = (t1 - t0) + (t5 - t4) + (0.0 if gen.rounds else t_reset)
        setup = switched or first_use
        t_sync = sum(d.t_sync for d in made.values())
        t_draft = sum(d.t_propose for d in made.values()) + routed_time + (0.0 if setup else t_sync)
        drafted = tree.size if tree is not None else len(made[arm].draft.tokens)
        several = tree is not None and len(members) > 1
        rnd = Round(index=len(gen.rounds), arm=arm, drafted=drafted, accepted=accepted, n_max=n_max,
                    be=block_efficiency(accepted, n_max), bd=bd, emitted=len(new), t_select=t_select,
                    t_draft=t_draft, t_verify=t4 - t3, t_switch=t_sync if setup else 0.0, switched=switched,
                    first_use=first_use, deferred=deferred)
        if isinstance(choice, Plan):
            rnd.expected, rnd.predicted_s = choice.estimate()
        if tree is None:
            nodes = {arm: chain_outcomes(len(made[arm].draft.tokens), accepted)}
        else:
            nodes = {m: draw_outcomes(tree, m, verdict.path) for m in members}
        if several:
            own = {m: min(verdict.agreement(tree, m), accepted) for m in members}
            rnd.members, rnd.tree_size = list(members), tree.size
            rnd.member_accepted, rnd.winners = own, verdict.winners(tree)
            selector.update_tree({m: Feedback(drafted=len(made[m].draft.tokens), accepted=own[m], n_max=made[m].n_max,
                                              be=block_efficiency(own[m], made[m].n_max), bd=mine[m],
                                              t_draft=made[m].t_propose, t_verify=rnd.t_verify,
                                              t_switch=made[m].t_sync if made[m].first else 0.0, nodes=nodes[m])
                                  for m in members})
        else:
            selector.update(arm, Feedback(drafted=rnd.drafted, accepted=accepted, n_max=n_max, be=rnd.be, bd=bd,
                                          t_draft=rnd.t_draft, t_verify=rnd.t_verify, t_switch=rnd.t_switch,
                                          nodes=nodes[arm]))
        gen.rounds.append(rnd)
        if selector.full_information:
            for name, side_bd in side.items():
                selector.observe(name, side_bd)
        prev_members = members
        if done:
            break
    gen.target_calls = target.calls
    gen.seconds = clock.boundary() - t_start
    return gen
