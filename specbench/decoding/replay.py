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
approximately: dynamic int8 quantization scales each forward's whole input at once, so a catch-up over many
tokens computes other probabilities than one over a single token (``Drafter.history_free``).

Time is predicted, not measured (``Costs``): a round costs the target's forward over its scored tokens at
its context length (the measured cost curve, interpolated), the members' traced propose times, and for
a member not synced at the previous round's position its catch-up (the measured catch-up curve over the
tokens it missed; on its first use in the query, its traced setup too). The prefill is the trace's.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from specbench.arms import AUTOREGRESSIVE
from specbench.decoding.loop import Generation, Limits, round_members, tree_label
from specbench.decoding.trace import QueryTrace
from specbench.decoding.tree import build_tree
from specbench.decoding.verify import block_efficiency
from specbench.errors import SpecbenchError
from specbench.records import Round
from specbench.selection.base import Feedback, Selector


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through ``(xs, ys)`` (``xs`` increasing), extended linearly past both ends, >= 0."""
    if len(xs) == 1:
        return float(ys[0])
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass(frozen=True)
class Costs:
    """The replay clock's cost curves: ``seconds[c][i]``, the target's forward over ``q[i]`` new tokens after a
    ``contexts[c]``-token context (``specbench profile``'s ``profile.json`` or the trace's ``costs.json``), and
    ``catch_up[name]``: ``(tokens, seconds)`` pairs of a drafter's ``sync`` over that many missed tokens;
    ``tree_extra``: the seconds a tree forward costs beyond a chain forward over as many tokens (its attention mask
    and the all-row softmax, measured by the trace: ``tree_extra_s`` in ``costs.json``; 0 in older traces), charged
    to every tree round."""

    q: tuple[int, ...]
    contexts: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]
    catch_up: Mapping[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    tree_extra: float = 0.0

    @classmethod
    def from_dict(cls, d: Mapping, catch_up: Mapping | None = None, tree_extra: float | None = None) -> Costs:
        try:
            q = tuple(int(x) for x in d["q"])
            contexts = tuple(int(c) for c in d["contexts"])
            seconds = tuple(tuple(float(s) for s in d["seconds"][str(c)]) for c in contexts)
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecbenchError(
                f"the cost profile has no usable q / contexts / seconds ({exc!r})",
                "point profile_path at a `specbench profile` run, or trace again",
            ) from exc
        if not q or not contexts or any(len(s) != len(q) for s in seconds):
            raise SpecbenchError(
                "the cost profile's seconds do not match its q and contexts",
                "point profile_path at a `specbench profile` run, or trace again",
            )
        ups = catch_up if catch_up is not None else d.get("catch_up") or {}
        return cls(
            q,
            contexts,
            seconds,
            {name: tuple((int(n), float(s)) for n, s in pairs) for name, pairs in ups.items()},
            max(float(d.get("tree_extra_s") or 0.0) if tree_extra is None else float(tree_extra), 0.0),
        )

    def verify(self, q: int, context: int) -> float:
        """Seconds of one target forward over ``q`` new tokens after ``context`` tokens."""
        per = [interpolate(self.q, s, q) for s in self.seconds]
        return interpolate(self.contexts, per, context)

    def sync(self, name: str, tokens: int) -> float:
        """Seconds of ``name``'s catch-up over ``tokens`` missed tokens (0 for a drafter without a curve)."""
        pairs = self.catch_up.get(name)
        if not pairs or tokens <= 0:
            return 0.0
        return interpolate([n for n, _ in pairs], [s for _, s in pairs], tokens)


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
            return 1.0 / max(self.costs.verify(1, context), 1e-12)
        dt = tr.drafters[arm]
        n = len(dt.draft(t, min(self.lengths[arm], room)))
        last = self.synced.get(arm)
        catch_up = dt.t_setup + self.costs.sync(arm, t) if last is None else self.costs.sync(arm, t - last)
        seconds = self.costs.verify(n + 1, context) + dt.seconds(t, n) + catch_up
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
    output, eos_ids = trace.output, frozenset(trace.eos_ids)
    view = (
        TraceView(trace, costs, draft_lengths, limits.max_new_tokens)
        if getattr(selector, "sees_trace", False)
        else None
    )
    if view is not None:
        selector.view = view
    selector.reset(query)
    observable = [n for n, dt in trace.drafters.items() if dt.observable] if selector.full_information else []
    out: list[int] = []
    gen = Replayed(tokens=out)
    synced: dict[str, int] = (
        view.synced if view is not None else {}
    )  # arm -> position last synced at (first use: absent)
    prev_members: tuple[str, ...] | None = None
    seconds = trace.t_prefill
    while len(out) < limits.max_new_tokens:
        t = len(out)
        if view is not None:
            view.t = t
        choice = selector.select()
        room = limits.max_new_tokens - t - 1
        context = trace.prompt_len + t

        def draft_with(name: str, t: int = t, room: int = room) -> _Member:
            if name == AUTOREGRESSIVE:
                synced[name] = t
                return _Member([], 0, 0, False, 0.0, 0.0, None)
            dt = trace.drafters.get(name)
            if dt is None:
                raise SpecbenchError(
                    f"the selector played '{name}', which the trace does not hold",
                    f"replay with arms of the traced pool: {', '.join(trace.drafters)}",
                )
            k = min(draft_lengths[name], room)
            first = name not in synced
            t_sync = dt.t_setup + costs.sync(name, t) if first else costs.sync(name, t - synced[name])
            synced[name] = t
            draft = dt.draft(t, k)
            return _Member(
                draft, k, k, first, t_sync, dt.seconds(t, len(draft)) if k > 0 else 0.0, dt.match[t]
            )

        members, made, unused = round_members(
            choice, draft_with, lambda d, n: bool(d.draft) and (d.match or 0) >= n, type(selector).__name__
        )
        routed = unused.t_sync + unused.t_propose if unused is not None else 0.0
        switched = prev_members is not None and members != prev_members
        first_use = any(d.first for d in made.values())
        own = {m: (trace.drafters[m].accepted_of(t, len(d.draft)) if d.draft else 0) for m, d in made.items()}
        mine = {
            m: (trace.drafters[m].divergence(t, len(d.draft), d.n_max) if d.draft else 0.0)
            for m, d in made.items()
        }
        tree = None
        if len(members) == 1:
            arm = members[0]
            drafted, n_max = len(made[arm].draft), made[arm].n_max
            accepted_raw, bd = own[arm], mine[arm]
        else:
            arm = tree_label(members)
            tree = build_tree({m: made[m].draft for m in members})
            drafted, n_max = tree.size, max(d.n_max for d in made.values())
            accepted_raw, bd = max(own.values()), max(mine.values())
        new = list(output[t : t + accepted_raw + 1])
        for i, tok in enumerate(new):
            if tok in eos_ids:
                new = new[: i + 1]
                gen.stop = "eos"
                break
        if len(new) < accepted_raw + 1 and gen.stop != "eos":
            raise SpecbenchError(
                f"the trace ends at {len(output)} tokens without an EOS, before the replay's round at "
                f"position {t} could emit {accepted_raw + 1}",
                "trace with more new tokens",
            )
        accepted = min(accepted_raw, len(new))
        out.extend(new)
        done = gen.stop == "eos" or len(out) >= limits.max_new_tokens
        t_verify = costs.verify(drafted + 1, context) + (costs.tree_extra if tree is not None else 0.0)
        setup = switched or first_use
        t_sync = sum(d.t_sync for d in made.values())
        t_draft = sum(d.t_propose for d in made.values()) + routed + (0.0 if setup else t_sync)
        rnd = Round(
            index=len(gen.rounds),
            arm=arm,
            drafted=drafted,
            accepted=accepted,
            n_max=n_max,
            be=block_efficiency(accepted, n_max),
            bd=bd,
            emitted=len(new),
            t_select=0.0,
            t_draft=t_draft,
            t_verify=t_verify,
            t_switch=t_sync if setup else 0.0,
            switched=switched,
            first_use=first_use,
        )
        if tree is not None:
            mem = {m: min(own[m], accepted) for m in members}
            rnd.members, rnd.tree_size = list(members), tree.size
            rnd.member_accepted = mem
            rnd.winners = [m for m in tree.paths if accepted_raw and own[m] == accepted_raw]
            selector.update_tree(
                {
                    m: Feedback(
                        drafted=len(made[m].draft),
                        accepted=mem[m],
                        n_max=made[m].n_max,
                        be=block_efficiency(mem[m], made[m].n_max),
                        bd=mine[m],
                        t_draft=made[m].t_propose,
                        t_verify=t_verify,
                        t_switch=made[m].t_sync if made[m].first else 0.0,
                    )
                    for m in members
                }
            )
        else:
            selector.update(
                arm,
                Feedback(
                    drafted=drafted,
                    accepted=accepted,
                    n_max=n_max,
                    be=rnd.be,
                    bd=bd,
                    t_draft=t_draft,
                    t_verify=t_verify,
                    t_switch=rnd.t_switch,
                ),
            )
        gen.rounds.append(rnd)
        if observable and tree is None and drafted:
            traced_draft = len(made[arm].draft) == len(trace.drafters[arm].drafts[t])
            t_observe = trace.drafters[arm].t_observe
            if (
                t_observe is not None
            ):  # what the live loop pays for its observers' side observations (its t_select)
                rnd.t_select += t_observe[t]
                seconds += t_observe[t]
            for name in observable:
                if name not in members:
                    dt = trace.drafters[name]
                    if dt.side is not None and traced_draft:  # what the loop's observe returned (exact)
                        value = dt.side[t].get(arm)
                    else:  # counterfactual: its own draft's Block Divergence here (module docstring)
                        k = min(draft_lengths[name], room)
                        value = dt.divergence(t, len(dt.draft(t, k)), k)
                        gen.counterfactual += 1
                    if value is not None:
                        selector.observe(name, value)
        seconds += t_draft + t_verify + rnd.t_switch
        prev_members = members
        if done:
            break
    gen.seconds = seconds
    gen.target_calls = len(gen.rounds)
    return gen
