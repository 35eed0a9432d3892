"""Exact replay of a selector over an acceptance trace (``decoding/trace.py``): no model calls.

``replay`` is the decode loop's twin on recorded data. Each round the selector picks (an arm, a tree or a
``Route``); each drafted member's draft is its traced draft at the position, cut to ``min(draft length,
room)`` as the loop cuts it; greedy acceptance is the traced acceptance cut to that length (a tree accepts
the longest of its members'); the emitted tokens are the traced output's next ``accepted + 1`` (cut after
an EOS); Block Divergence is the sum of the traced overlaps over the draft's positions divided by ``N_max``.
The selector gets the same ``Feedback`` (``update``, ``update_tree``) in the same order as live, so a
replayed greedy run equals the live one round for round: arm, drafted, accepted, emitted, BE exactly, BD to
rounding (``tests/integration/test_replay.py``). Under full information the live loop reads an unplayed
drafter's side observation off the played draft's rows (``Drafter.observe``): a trace made with
``side_observations`` holds that value for every (observer, played drafter) pair and the replay gives it;
without them (or for a draft cut shorter than traced) the observer gets its own draft's Block Divergence at
the position (what it would have had, played: counted in ``Replayed.counterfactual``), and full-information
selectors then replay counterfactually, not to the round. A trace with side observations also holds what they
cost (``DrafterTrace.t_observe``: every observer's ``observe`` of the played draft, timed), which the replay adds to
the round (its ``t_select``, where the live loop books it); a counterfactual replay has no such time and is
optimistic.

Drafters whose distributions depend on how they caught up, not only on the committed tokens, replay
approximately: dynamic int8 quantization scales each forward's whole input at once, and a model drafter or head
in bf16 or fp16 rounds a forward over many tokens differently from one token at a time, so a catch-up over many
tokens computes other probabilities than one over a single token (``Drafter.history_free``).

Time is predicted, not measured (``Costs``, ``replay_costs.py``): a round costs the target's forward over its scored tokens at
its context length (the measured cost curve, interpolated), the members' traced propose times, and for
a member not synced at the previous round's position its catch-up (the measured catch-up curve over the
tokens it missed; on its first use in the query, its traced setup too). The prefill is the trace's. What a live
verification costs beyond the forward (the probabilities of every row, the acceptance, Block Divergence of each
member, the cache's commit, and in a tree round its mask and the move of the accepted path's rows) is the round's
overhead (``Costs.overhead``): fitted per kind of round (``ROUND_KINDS``) from a live run's own rounds when one is
given (``fit_overheads``), else a tree round is charged the trace's measured ``tree_extra`` and a chain nothing. A
switch back to a drafter used earlier in the query is charged, beyond its catch-up curve, what a live switch took
beyond it (``SWITCH``, fitted the same way: the curve is timed on a drafter alone, a switch inside the loop also
pays for its cache's crop and the features it catches up on).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from specbench.arms import AUTOREGRESSIVE
from specbench.decoding.generation import Generation, Limits
from specbench.decoding.replay_costs import AUTOREGRESSIVE_ROUND, SWITCH, Costs, round_kind
from specbench.decoding.rounds import Counts, round_members, round_record, tree_label
from specbench.decoding.trace import QueryTrace
from specbench.decoding.tree import TokenTree, build_tree
from specbench.decoding.verify import block_efficiency
from specbench.errors import SpecbenchError
from specbench.records import Round
from specbench.selection.base import Feedback, Selector, feedback_of


class TraceView:
    """What a trace-reading selector (``sees_trace``: the oracles) may look at before choosing."""

    def __init__(self, trace: QueryTrace, costs: Costs, lengths: Mapping[str, int], max_new_tokens: int):
        self.trace, self.costs, self.lengths, self.max_new_tokens = trace, costs, lengths, max_new_tokens
        self.t = 0
        self.synced: dict[str, int] = {}  # the replay's: arm -> position it was last synced at

    def round_speed(self, arm: str) -> float:
        """Tokens per predicted second of a round of ``arm`` alone at the current position."""
        tr, t = self.trace, self.t
        room = self.max_new_tokens - t - 1
        context = tr.prompt_len + t
        if arm == AUTOREGRESSIVE:
            return 1.0 / max(self.costs.verify(1, context) + self.costs.overhead(AUTOREGRESSIVE_ROUND), 1e-12)
        dt = tr.drafters[arm]
        n = len(dt.draft(t, min(self.lengths[arm], room)))
        last = self.synced.get(arm)
        catch_up = dt.t_setup + self.costs.sync(arm, t) if last is None else self.costs.sync(arm, t - last)
        seconds = (
            self.costs.verify(n + 1, context) + self.costs.overhead(round_kind(n, False)) + dt.seconds(t, n)
        )
        seconds += catch_up
        return (dt.accepted_of(t, n) + 1) / max(seconds, 1e-12)


class RoundOracle(Selector):
    """The per-round oracle: each round, in hindsight, the arm (the autoregressive one included) whose round
    emits the most tokens per predicted second at that position, its catch-up included (greedy in the round: not
    a bound over whole queries when switching costs). Replay only: it reads the trace."""

    sees_trace = True

    def __init__(self, arms: list[str]):
        super().__init__(arms)
        self.view: TraceView | None = None

    def select(self) -> str:
        return max(self.arms, key=self.view.round_speed)


@dataclass
class Replayed(Generation):
    """A replayed generation: ``seconds`` predicted; ``counterfactual``: side observations given as the observer's own
    draft's Block Divergence because the trace did not hold the live one (``trace.side_observations`` off, or a
    draft cut shorter than traced)."""

    counterfactual: int = 0


@dataclass
class _Member:
    draft: list[int]
    k: int
    n_max: int
    first: bool
    t_sync: float
    t_propose: float
    match: int | None  # retrieval drafters: the context match of its traced draft (routing)


@dataclass
class _Walk:
    """One query's replay in progress: its inputs, the arms' sync positions and the generation so far."""

    trace: QueryTrace
    selector: Selector
    limits: Limits
    costs: Costs
    draft_lengths: Mapping[str, int]
    synced: dict[str, int]  # arm -> position last synced at (first use: absent)
    observable: list[str]  # drafters that give side observations, under a full-information selector
    gen: Replayed
    view: TraceView | None  # what a trace-reading selector (an oracle) looks at


@dataclass
class _Outcome:
    """What a round's drafts earn on the trace: the round's label, its tree (several members), drafted and scored
    size, greedy acceptance before the EOS cut, Block Divergence; per member its own acceptance and divergence."""

    arm: str
    tree: TokenTree | None
    drafted: int
    n_max: int
    accepted_raw: int
    bd: float
    own: dict[str, int]
    mine: dict[str, float]


def replay(
    trace: QueryTrace,
    selector: Selector,
    limits: Limits,
    costs: Costs,
    draft_lengths: Mapping[str, int],
    query=None,
) -> Generation:
    """Replay ``selector`` over one query's trace (module docstring): a ``Generation`` whose rounds carry the
    same fields as the loop's, with predicted times. ``draft_lengths``: each arm's draft length in the
    replayed run (at most its trace length)."""
    w = _start(trace, selector, limits, costs, draft_lengths, query)
    prev_members: tuple[str, ...] | None = None
    seconds = trace.t_prefill
    while len(w.gen.tokens) < limits.max_new_tokens:
        t = len(w.gen.tokens)
        if w.view is not None:
            w.view.t = t
        members, made, unused = _draft(w, t)
        o = _outcome(w, t, members, made)
        new = _emit(w, t, o.accepted_raw)
        done = w.gen.stop == "eos" or len(w.gen.tokens) >= limits.max_new_tokens
        switched = prev_members is not None and members != prev_members
        rnd = _round(w, t, o, made, unused, len(new), switched)
        _feed(w, o, rnd, members, made)
        w.gen.rounds.append(rnd)
        seconds += _observe(w, t, o, rnd, members, made)
        seconds += rnd.t_draft + rnd.t_verify + rnd.t_switch
        prev_members = members
        if done:
            break
    w.gen.seconds = seconds
    w.gen.target_calls = len(w.gen.rounds)
    return w.gen


def _start(trace, selector, limits, costs, draft_lengths, query) -> _Walk:
    """Refuse what cannot replay, give a trace-reading selector its view, and reset the selector for the query."""
    if selector.embedding_pooling is not None:
        raise SpecbenchError(
            f"{type(selector).__name__} reads the query's embedding, which a trace does not record",
            "evaluate context-aware selectors (selector=policy) live with specbench eval",
        )
    if limits.max_new_tokens > trace.max_new_tokens and trace.stop != "eos":
        raise SpecbenchError(
            f"the replay asks for {limits.max_new_tokens} new tokens; the trace holds {trace.max_new_tokens}",
            "replay with replay.max_new_tokens at most the trace's",
        )
    view = (
        TraceView(trace, costs, draft_lengths, limits.max_new_tokens)
        if getattr(selector, "sees_trace", False)
        else None
    )
    if view is not None:
        selector.view = view
    selector.reset(query)
    observable = [n for n, dt in trace.drafters.items() if dt.observable] if selector.full_information else []
    synced: dict[str, int] = view.synced if view is not None else {}
    return _Walk(trace, selector, limits, costs, draft_lengths, synced, observable, Replayed(tokens=[]), view)


def _draft(w: _Walk, t: int):
    """The selector's choice and its members' traced drafts at position ``t`` (``round_members``, as live)."""
    trace, costs, synced = w.trace, w.costs, w.synced
    choice = w.selector.select()
    room = w.limits.max_new_tokens - t - 1

    def draft_with(name: str) -> _Member:
        if name == AUTOREGRESSIVE:
            synced[name] = t
            return _Member([], 0, 0, False, 0.0, 0.0, None)
        dt = trace.drafters.get(name)
        if dt is None:
            raise SpecbenchError(
                f"the selector played '{name}', which the trace does not hold",
                f"replay with arms of the traced pool: {', '.join(trace.drafters)}",
            )
        k = min(w.draft_lengths[name], room)
        first = name not in synced
        t_sync = dt.t_setup + costs.sync(name, t) if first else costs.sync(name, t - synced[name])
        synced[name] = t
        draft = dt.draft(t, k)
        return _Member(draft, k, k, first, t_sync, dt.seconds(t, len(draft)) if k > 0 else 0.0, dt.match[t])

    return round_members(
        choice, draft_with, lambda d, n: bool(d.draft) and (d.match or 0) >= n, type(w.selector).__name__
    )


def _outcome(w: _Walk, t: int, members: tuple[str, ...], made: Mapping[str, _Member]) -> _Outcome:
    """The round's acceptance and divergence on the trace: a chain's own, or a tree's longest member's."""
    drafters = w.trace.drafters
    own = {m: (drafters[m].accepted_of(t, len(d.draft)) if d.draft else 0) for m, d in made.items()}
    mine = {
        m: (drafters[m].divergence(t, len(d.draft), d.n_max) if d.draft else 0.0) for m, d in made.items()
    }
    if len(members) == 1:
        arm = members[0]
        return _Outcome(arm, None, len(made[arm].draft), made[arm].n_max, own[arm], mine[arm], own, mine)
    tree = build_tree({m: made[m].draft for m in members})
    n_max = max(d.n_max for d in made.values())
    return _Outcome(
        tree_label(members), tree, tree.size, n_max, max(own.values()), max(mine.values()), own, mine
    )


def _emit(w: _Walk, t: int, accepted_raw: int) -> list[int]:
    """The traced output's next ``accepted_raw + 1`` tokens, cut after an EOS, appended to the generation."""
    gen, output = w.gen, w.trace.output
    new = list(output[t : t + accepted_raw + 1])
    for i, tok in enumerate(new):
        if tok in w.trace.eos_ids:
            new = new[: i + 1]
            gen.stop = "eos"
            break
    if len(new) < accepted_raw + 1 and gen.stop != "eos":
        raise SpecbenchError(
            f"the trace ends at {len(output)} tokens without an EOS, before the replay's round at "
            f"position {t} could emit {accepted_raw + 1}",
            "trace with more new tokens",
        )
    gen.tokens.extend(new)
    return new


def _round(w: _Walk, t: int, o: _Outcome, made, unused, emitted: int, switched: bool) -> Round:
    """The round's record with its predicted times (the module docstring's clock), built as the live loop builds its
    own (``rounds.round_record``)."""
    costs = w.costs
    routed = unused.t_sync + unused.t_propose if unused is not None else 0.0
    t_verify = costs.verify(o.drafted + 1, w.trace.prompt_len + t) + costs.overhead(
        round_kind(o.drafted, o.tree is not None)
    )
    # beyond the catch-up curve, what a live switch pays (fit_overheads)
    counts = Counts(o.drafted, min(o.accepted_raw, emitted), o.n_max, o.bd, emitted)
    return round_record(
        len(w.gen.rounds), o.arm, counts, made, routed, switched, (0.0, t_verify), costs.overhead(SWITCH)
    )


def _feed(w: _Walk, o: _Outcome, rnd: Round, members, made) -> None:
    """The selector's feedback, as the live loop gives it: per member of a tree (``update_tree``), else the arm's."""
    if o.tree is None:
        w.selector.update(o.arm, feedback_of(rnd))
        return
    mem = {m: min(o.own[m], rnd.accepted) for m in members}
    rnd.members, rnd.tree_size = list(members), o.tree.size
    rnd.member_accepted = mem
    rnd.winners = [m for m in o.tree.paths if o.accepted_raw and o.own[m] == o.accepted_raw]
    w.selector.update_tree(
        {
            m: Feedback(
                drafted=len(made[m].draft),
                accepted=mem[m],
                n_max=made[m].n_max,
                be=block_efficiency(mem[m], made[m].n_max),
                bd=o.mine[m],
                t_draft=made[m].t_propose,
                t_verify=rnd.t_verify,
                t_switch=made[m].t_sync if made[m].first else 0.0,
            )
            for m in members
        }
    )


def _observe(w: _Walk, t: int, o: _Outcome, rnd: Round, members, made) -> float:
    """Full information: each watching drafter outside the round gets its side observation (traced, else
    counterfactual: counted); the seconds the live loop paid for them (traced ``t_observe``), booked to t_select."""
    if not (w.observable and o.tree is None and o.drafted):
        return 0.0
    trace, arm = w.trace, o.arm
    traced_draft = len(made[arm].draft) == len(trace.drafters[arm].drafts[t])
    t_observe = trace.drafters[arm].t_observe
    seconds = 0.0
    if t_observe is not None:  # what the live loop pays for its observers' side observations (its t_select)
        rnd.t_select += t_observe[t]
        seconds = t_observe[t]
    room = w.limits.max_new_tokens - t - 1
    for name in w.observable:
        if name in members:
            continue
        dt = trace.drafters[name]
        if dt.side is not None and traced_draft:  # what the loop's observe returned (exact)
            value = dt.side[t].get(arm)
        else:  # counterfactual: its own draft's Block Divergence here (module docstring)
            k = min(w.draft_lengths[name], room)
            value = dt.divergence(t, len(dt.draft(t, k)), k)
            w.gen.counterfactual += 1
        if value is not None:
            w.selector.observe(name, value)
    return seconds
