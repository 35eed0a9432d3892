"""Acceptance traces: one greedy pass that records, at every output position, what every drafter would
propose there and how much of it the target would accept (``trace``), so that any selector can be replayed
over it exactly (``decoding/replay.py``) instead of decoding again.

Greedy decoding fixes the target's output, and with it every drafter's draft at every position of it:
a drafter's state is a function of the committed tokens (and of the target's states at them), never of
which rounds came before. So the walk is the autoregressive decode itself, with every step's one target
forward widened into a token tree (``decoding/tree.py``) that holds every drafter's draft at that position:

- each drafter is synced to the committed tokens through the loop's protocol (``sync``: the same
  ``DecodeContext``, its states filled from the prefill and from the root row of each forward, as the
  loop fills them from accepted rows) and proposes up to its trace length ``k`` (its own draft length or
  more), timed;
- one forward scores the tree: its root row chooses the next output token (the autoregressive one), and
  along each draft's own rows (the rows a chain forward over that draft computes) the trace keeps how many
  draft tokens agree with the target's argmax (greedy acceptance: a shorter draft accepts ``min(a, k)``)
  and, per drafted position, ``1 - TV(p, q)`` (``p(x)`` for a deterministic drafter), whose sum over a
  draft's first ``n`` positions divided by its ``N_max`` is the round's Block Divergence;
- only the root row is kept in the cache, and the next output token is committed.

Past a draft's first rejection its positions are conditioned on the draft's own tokens, not the output's:
the tree forward computes exactly those rows, so Block Divergence is the one the live loop computes (to
rounding). Greedy decoding only: a sampled round's outcome depends on its random draws.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import torch

from specbench.decoding.certify import deciders
from specbench.decoding.drafter import DecodeContext, Draft, Drafter, Verification, observations
from specbench.decoding.loop import DecodeSpec, Generation
from specbench.decoding.sampling import logits_to_probs
from specbench.decoding.tree import TokenTree, build_tree
from specbench.errors import SpecbenchError
from specbench.models.target import Target

FORMAT = 1  # the layout of a trace record (``QueryTrace.to_dict``)
DIGITS = 7  # overlaps are kept to this many decimals (Block Divergence replays to within 1e-6)


@dataclass
class DrafterTrace:
    """One drafter along one query's output: per output position ``t`` (tokens generated before the round),
    its draft of up to ``k`` tokens, the greedy acceptance of that draft, the per-position overlaps
    ``1 - TV(p_j, q_j)``, the context match (retrieval drafters, for routing) and the propose time."""

    k: int
    drafts: list[list[int]] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    overlap: list[list[float]] = field(default_factory=list)
    match: list[int | None] = field(default_factory=list)
    t_propose: list[float] = field(default_factory=list)
    t_setup: float = 0.0  # the first sync of the query: per-query setup and the prompt's catch-up
    observable: bool = False  # gives side observations under full information (``state_layers(True)``)
    # with side observations traced: per position, {played drafter: the side observation this drafter's
    # ``observe`` returns when that drafter's traced draft is verified} (what the loop hands a full-information selector)
    side: list[dict[str, float]] | None = None
    history_free: bool = True  # ``Drafter.history_free``: False means its rewards replay approximately
    # with side observations traced: per position, the seconds every observer's ``observe`` of this drafter's draft
    # took (what a full-information round that plays it pays on top of its verification; the replay charges it)
    t_observe: list[float] | None = None

    def draft(self, t: int, k: int) -> list[int]:
        return self.drafts[t][:k] if k > 0 else []

    def accepted_of(self, t: int, n: int) -> int:
        """Greedy acceptance of the draft cut to ``n`` tokens."""
        return min(self.accepted[t], n)

    def divergence(self, t: int, n: int, n_max: int) -> float:
        """Block Divergence of the draft cut to ``n`` tokens with ``N_max = n_max`` (0 when nothing was drafted)."""
        if n_max <= 0 or n == 0:
            return 0.0
        return sum(self.overlap[t][:n]) / n_max

    def seconds(self, t: int, n: int) -> float:
        """Propose time of ``n`` tokens at ``t``, scaled from the traced draft's time by its length."""
        full = len(self.drafts[t])
        return self.t_propose[t] * (max(n, 1) / max(full, 1)) if n < full else self.t_propose[t]


@dataclass
class QueryTrace:
    """One query's trace: the target's greedy output (ending at EOS or ``max_new_tokens``), its prompt length
    and prefill time, and a ``DrafterTrace`` per drafter of the pool (the autoregressive arm drafts nothing)."""

    prompt_len: int
    output: list[int]
    stop: str
    max_new_tokens: int
    t_prefill: float
    drafters: dict[str, DrafterTrace]
    eos_ids: list[int] = field(default_factory=list)
    format: int = FORMAT

    @property
    def positions(self) -> int:
        return len(self.output)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> QueryTrace:
        if d.get("format") != FORMAT:
            raise SpecbenchError(
                f"a trace record has format {d.get('format')!r}; this specbench reads format {FORMAT}",
                "trace again with this version of specbench (a new run directory)",
            )
        drafters = {name: DrafterTrace(**dt) for name, dt in d["drafters"].items()}
        return cls(**{**d, "drafters": drafters})


@dataclass(frozen=True)
class TreeStep:
    """One step of the walk: the token tree of every drafter's draft, the drafts, the target's processed
    distributions at every row of the tree forward and the states it returned (``{layer: [rows, H]}``)."""

    tree: TokenTree
    drafts: Mapping[str, Draft]
    p: torch.Tensor
    states: Mapping[int, torch.Tensor]


def trace_lengths(pool: Mapping[str, Drafter], draft_length: int, at_least: int | None) -> dict[str, int]:
    """Each drafting arm's trace length: its own draft length (or the run's), raised to ``at_least`` when set."""
    return {
        name: max(d.draft_length or draft_length, int(at_least or 0)) for name, d in pool.items() if d.drafts
    }


def check_greedy(spec: DecodeSpec) -> None:
    if not spec.sampling.greedy:
        raise SpecbenchError(
            "a trace records greedy decoding (the target's output and every draft are then fixed); "
            f"this run samples at temperature {spec.sampling.temperature:g}",
            "trace with decoding=greedy (temperature 0)",
        )
    if spec.cascade is not None and not spec.cascade.lossless:
        raise SpecbenchError(
            "a trace records lossless verification; a cascade rule changes the output",
            "trace with cascade=none",
        )


def check_chains(pool: Mapping[str, Drafter], lengths: Mapping[str, int]) -> None:
    """Refuse drafters that draft trees (a dynamic draft tree, a retrieval tree): a trace records one chain each."""
    trees = [name for name in lengths if getattr(pool[name], "tree", None) is not None]
    if trees:
        raise SpecbenchError(
            f"a trace records one chain draft per drafter and position; {', '.join(trees)} "
            f"draft{'s' if len(trees) == 1 else ''} a tree each round",
            "trace with tree=null on those drafters (pool.drafters.<name>.tree=null), or evaluate "
            "them live (specbench eval)",
        )


def check_decoder_only(target: Target) -> None:
    if target.is_encoder_decoder:
        raise SpecbenchError(
            "specbench trace verifies every drafter's draft as one token tree, which needs a "
            f"decoder-only target; this one is encoder-decoder ({type(target.model).__name__})",
            "trace a decoder-only target (eval measures encoder-decoder targets live)",
        )


@torch.inference_mode()
def trace(
    target: Target,
    pool: Mapping[str, Drafter],
    prompt_ids: list[int],
    spec: DecodeSpec,
    lengths: Mapping[str, int],
    rng: torch.Generator,
    side_observations: bool = False,
) -> tuple[QueryTrace, Generation]:
    """Walk the greedy output of one prompt, recording every drafter of ``lengths`` at every position (module
    docstring): the trace and the output as a ``Generation`` (its deciders certify it like eval's). Drafters
    that draft trees are refused (``check_chains``). ``side_observations``: also record, for every drafter that
    observes under full information (``state_layers(True)``) and every other drafter's traced draft, the side
    observation its ``observe`` returns when that draft is the one verified (read off the same tree forward's
    rows along it), so that full-information selectors replay to the round."""
    check_greedy(spec)
    check_decoder_only(target)
    check_chains(pool, lengths)
    limits, eos_ids, clock = spec.limits, spec.eos_ids, spec.clock
    drafters = {name: pool[name] for name in lengths}
    observers = {name: d for name, d in drafters.items() if side_observations and d.state_layers(True)}
    layers = tuple(
        sorted({x for d in drafters.values() for x in d.state_layers(False)} | side_layers(observers))
    )
    t0 = clock.boundary()
    ctx = prefilled_context(target, prompt_ids, layers, bool(observers))
    t_prefill = clock.now() - t0
    traces = empty_traces(drafters, lengths, observers)
    out: list[int] = []
    gen = Generation(tokens=out, deciders=[])
    while len(out) < limits.max_new_tokens:
        room = limits.max_new_tokens - len(out) - 1
        drafts = draft_all(drafters, traces, target, ctx, spec, rng, room, first=not out)
        tree = build_tree({name: drafts[name].tokens for name in drafters})
        scores = target.score_tree(tree, layers=layers)
        logits = scores.logits
        p = logits_to_probs(logits, spec.sampling)
        best = torch.argmax(logits, dim=-1).tolist()
        record_acceptance(traces, tree, drafts, best, p)
        if observers:
            step = TreeStep(tree, drafts, p, scores.states)
            observe_all(observers, traces, step, target.tokens, ctx, spec, room, clock)
        token = best[0]
        gen.deciders.extend(deciders(logits, 1))
        out.append(token)
        if token in eos_ids:
            gen.stop = "eos"
            break
        if len(out) >= limits.max_new_tokens:
            break
        last = len(target.tokens) - 1
        target.commit_tree((), [token])
        if layers:  # the committed token's row: the tree's root
            ctx.record_states({layer: x[:1] for layer, x in scores.states.items()}, rows=1, start=last)
    gen.target_calls = target.calls
    gen.seconds = clock.boundary() - t0
    eos = sorted(int(e) for e in eos_ids)
    result = QueryTrace(len(prompt_ids), list(out), gen.stop, limits.max_new_tokens, t_prefill, traces, eos)
    return result, gen


def side_layers(observers: Mapping[str, Drafter]) -> set[int]:
    """The target layers the observers read their side observations from."""
    return {layer for d in observers.values() for layer in d.state_layers(True)}


def prefilled_context(target: Target, prompt_ids: list[int], layers: tuple[int, ...], observing: bool):
    """The target prefilled with the prompt, and the drafters' shared context holding its states at ``layers``."""
    prefilled = target.prefill(prompt_ids, layers=layers)
    ctx = DecodeContext(
        encoder_ids=target.encoder_ids,
        encoder_outputs=target.encoder_outputs,
        side_observations=observing,
    )
    if layers:
        ctx.record_states(prefilled.states, rows=len(target.tokens) - 1, start=0)
    return ctx


def empty_traces(
    drafters: Mapping[str, Drafter], lengths: Mapping[str, int], observers: Mapping[str, Drafter]
) -> dict[str, DrafterTrace]:
    """Each drafter's trace before the first position: its traced length and what it records."""
    return {
        name: DrafterTrace(
            k=int(lengths[name]),
            observable=bool(d.state_layers(True)),
            side=[] if name in observers else None,
            history_free=d.history_free,
            t_observe=[] if observers else None,
        )
        for name, d in drafters.items()
    }


def draft_all(
    drafters: Mapping[str, Drafter],
    traces: Mapping[str, DrafterTrace],
    target: Target,
    ctx: DecodeContext,
    spec: DecodeSpec,
    rng: torch.Generator,
    room: int,
    first: bool,
) -> dict[str, Draft]:
    """Every drafter synced and drafting at the current position (up to its traced length, cut by ``room``); its
    draft, context match and propose time recorded, and on the ``first`` position its setup (the first sync)."""
    clock = spec.clock
    drafts: dict[str, Draft] = {}
    for name, d in drafters.items():
        tr = traces[name]
        ta = clock.now()
        d.sync(ctx, target.tokens)
        tb = clock.now()
        n = min(tr.k, room)
        drafts[name] = (
            d.propose(target.tokens, n, spec.sampling, rng, spec.eos_ids) if n > 0 else Draft([], None)
        )
        tc = clock.now()
        if first:
            tr.t_setup = tb - ta
        tr.t_propose.append(round(tc - tb, 7))
        tr.drafts.append(list(drafts[name].tokens))
        tr.match.append(drafts[name].match)
    return drafts


def record_acceptance(
    traces: Mapping[str, DrafterTrace],
    tree: TokenTree,
    drafts: Mapping[str, Draft],
    best: list[int],
    p: torch.Tensor,
) -> None:
    """Per drafter: how many of its draft's tokens the greedy target accepts (its path's rows' argmax), and the
    overlap of its distributions with the target's along them."""
    for name, draft in drafts.items():
        path = tree.paths[name]
        rows = [tree.parent_row(node) for node in path]
        accepted = 0
        while accepted < len(path) and best[rows[accepted]] == draft.tokens[accepted]:
            accepted += 1
        traces[name].accepted.append(accepted)
        traces[name].overlap.append(overlaps(draft, p[rows]) if path else [])


def observe_all(
    observers: Mapping[str, Drafter],
    traces: Mapping[str, DrafterTrace],
    step: TreeStep,
    tokens: list[int],
    ctx: DecodeContext,
    spec: DecodeSpec,
    room: int,
    clock,
) -> None:
    """Each observer's side observation of each other drafter's draft verified alone (the loop's ``Verification``
    over that draft's rows of the tree forward), appended to the observer's ``side``; the seconds they took together,
    appended to the played drafter's ``t_observe``."""
    seen = {name: {} for name in observers}
    tree, p, states = step.tree, step.p, step.states
    for played, draft in step.drafts.items():
        path = tree.paths[played]
        if not path:
            traces[played].t_observe.append(0.0)
            continue
        rows = [tree.parent_row(node) for node in path]
        v = Verification(
            draft=list(draft.tokens),
            p=p[rows],
            accepted=traces[played].accepted[-1],
            played=played,
            sampling=spec.sampling,
            states={layer: x[[0, *(1 + n for n in path)]] for layer, x in states.items()},
            context=list(tokens),
            query=ctx,
            draft_length=spec.limits.draft_length,
            room=room,
            eos_ids=spec.eos_ids,
        )
        t0 = clock.boundary()
        observed = observations(observers, v)
        traces[played].t_observe.append(round(clock.boundary() - t0, 7))
        for name, obs in observed.items():
            if obs is not None and name != played:
                seen[name][played] = round(float(obs), DIGITS)
    for name, values in seen.items():
        traces[name].side.append(values)


def overlaps(draft: Draft, p: torch.Tensor) -> list[float]:
    """Per drafted position ``1 - TV(p_j, q_j) = sum_v min(p_j, q_j)``; ``p_j(x_j)`` for a deterministic draft."""
    idx = torch.tensor(draft.tokens, device=p.device).unsqueeze(-1)
    if draft.probs is None:
        values = p.gather(-1, idx).squeeze(-1)
    else:
        values = torch.minimum(p, draft.probs.to(p.device)).sum(-1)
    return [round(float(v), DIGITS) for v in values]
