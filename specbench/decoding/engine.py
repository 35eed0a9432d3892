"""The one decode loop, over rows: every method at every batch size runs through ``decode_rows``.

A row is one query in flight (``rounds.Row``): its selector over its drafters, its committed tokens, its generation.
Each round every row chooses (its own selector), drafts (rows whose drafter drafts many rows in one forward,
``Drafter.shared_rows``, draft together; the others each alone, ``rounds.draft``), then one verification forward of
the target scores every row's chain or token tree (``Verifier.score``), then each row's steps run on its own rows of
that forward (``rounds.judge``, ``commit``, ``record``, ``learn``), the verifier keeps each row's accepted slots, and a
finished row leaves; with at most ``width`` rows in flight, the next waiting prompt takes its place before the next
round (continuous batching). ``decode`` (``loop.py``) is the batch of one.

Two verifiers speak the protocol (``Verifier``): ``OneRow``, the target alone (``models/target.py``: one query at a
time, encoder-decoder targets included; what batch 1 runs, as the trace and the profile do), and ``Rows``, a
decoder-only target's rows in one cache (``models/batched.py``). What a batch cannot run yet is refused before any
model loads, by one declaration (``pipelines/batch_settings.py``); the loop holds no per-kind code.

Each row's law is the target's whatever the batch: greedy rows keep the target's argmax, sampled rows run
speculative sampling against their own processed target distributions, their draws from the call's generator in row
order. With a ``budget`` (``batch_budget.py``) every row's chain is cut, each round, to the cap the budget chooses for
the whole batch (0: no row drafts), before the forward; a cut draft is verified as a shorter draft would be.

Times: ``BatchResult.seconds`` is the call's wall time (one clock boundary at each end); a row's ``seconds`` is the
time until it finished (at batch 1, between the same boundaries); a round's ``t_verify`` is the row's share of the
forward (the forward's seconds over the rows in it) plus its own verdict, its ``t_draft`` its own drafting (its share
of a drafting forward it took part in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from specbench.decoding import rounds
from specbench.decoding.batch_budget import BatchBudget, first_path
from specbench.decoding.drafter import DecodeContext, Draft, Drafter, keep_tokens
from specbench.decoding.generation import DecodeSpec, Generation
from specbench.decoding.rounds import Drafted, Row, Turn
from specbench.errors import SpecbenchError
from specbench.models.cache import check_tree_attention
from specbench.models.target import Forward, Target
from specbench.selection.base import Selector


@dataclass(frozen=True)
class Player:
    """Who decodes a prompt: a selector (a fresh state a query: ``reset``) over a pool of drafters."""

    selector: Selector
    pool: Mapping[str, Drafter]


@dataclass(frozen=True)
class Job:
    """One prompt to decode: who decodes it, the prompt, its own limits (None: the call's ``spec``'s) and its query
    (what the selector's ``reset`` is given)."""

    player: Player
    prompt: list[int]
    limits: object = None  # a ``Limits``
    query: object = None


@dataclass(frozen=True)
class Admitted:
    """A row's start, read off its prefill: its committed tokens (the decoder's), its prompt embedding (with a
    pooling), its target states at the cached positions (with layers), and an encoder-decoder target's encoder
    inputs and output (None otherwise)."""

    tokens: list[int]
    embedding: torch.Tensor | None = None
    states: dict[int, torch.Tensor] | None = None
    encoder_ids: list[int] | None = None
    encoder_outputs: object = None


class Verifier(Protocol):
    """The target as the loop sees it: rows that are admitted (prefilled), scored together in one forward (each row's
    ``[last committed token, *draft]``, or its last committed token and a token tree's nodes, with the ``TokenTree``),
    keep what their verdicts accept (the offsets of the forward's inputs, and each row's committed tokens after the
    round), and leave."""

    def admit(self, prompt: list[int], pooling: str | None, layers: tuple[int, ...]) -> Admitted: ...

    def score(self, inputs: list[tuple[list[int], object]], layers: tuple[int, ...]) -> list[Forward]: ...

    def keep(self, kept: list[list[int]], tokens: list[list[int]]) -> None: ...

    def drop(self, going: list[int]) -> None: ...


class OneRow:
    """The target itself as a verifier of one row at a time, through its own single-query API (``Target.prefill``,
    ``score``, ``score_tree``, ``commit``, ``commit_tree``: what the trace, the profile and the tie calibration run);
    encoder-decoder targets too."""

    def __init__(self, target: Target):
        self.target = target
        self.live = False

    def admit(self, prompt: list[int], pooling: str | None, layers: tuple[int, ...]) -> Admitted:
        target = self.target
        if self.live:
            raise RuntimeError("OneRow verifies one row at a time")
        self.live = True
        prefilled = target.prefill(prompt, embedding=pooling, layers=layers)
        return Admitted(
            list(target.tokens),
            prefilled.embedding,
            prefilled.states,
            target.encoder_ids,
            target.encoder_outputs,
        )

    def score(self, inputs, layers: tuple[int, ...]) -> list[Forward]:
        ((ids, tree),) = inputs
        if tree is not None:
            return [self.target.score_tree(tree, layers=layers)]
        return [self.target.score(ids[1:], layers=layers)]

    def keep(self, kept: list[list[int]], tokens: list[list[int]]) -> None:
        ((offsets,), (committed,)) = kept, tokens
        target = self.target
        new = list(committed[len(target.tokens) :])
        if list(offsets) == list(range(len(offsets))):
            target.commit(new)
        else:  # a tree's root and accepted path: the path's nodes
            target.commit_tree(tuple(o - 1 for o in offsets[1:]), new)

    def drop(self, going: list[int]) -> None:
        self.live = bool(going)


class Rows:
    """A decoder-only target's rows in one cache (``BatchedLM``), scored in one forward."""

    def __init__(self, target: Target):
        from specbench.models.batched import BatchedLM

        self.lm = BatchedLM(target.model, target.vocab_size)
        self.lm.check_rows()

    def admit(self, prompt: list[int], pooling: str | None, layers: tuple[int, ...]) -> Admitted:
        started = self.lm.admit([prompt], pooling, layers)
        return Admitted(
            list(prompt),
            None if started.embeddings is None else started.embeddings[0],
            None if started.states is None else started.states[0],
        )

    def score(self, inputs, layers: tuple[int, ...]) -> list[Forward]:
        trees = [None if tree is None else (tree.attention(), tree.positions()) for _, tree in inputs]
        logits = self.lm.score([ids for ids, _ in inputs], layers, trees)
        return [
            Forward(logits[r, : len(ids)], {k: x[r, : len(ids)] for k, x in self.lm.last_states.items()})
            for r, (ids, _) in enumerate(inputs)
        ]

    def keep(self, kept: list[list[int]], tokens: list[list[int]]) -> None:
        self.lm.keep_slots(kept)

    def drop(self, going: list[int]) -> None:
        self.lm.drop(going)


def verifier_for(target: Target, width: int) -> Verifier:
    """``OneRow`` for one row at a time, ``Rows`` for a batch (decoder-only targets: ``BatchedLM`` refuses the rest,
    naming the fix)."""
    return OneRow(target) if width == 1 else Rows(target)


@dataclass
class BatchResult:
    generations: list  # one ``loop.Generation`` per prompt, in the prompts' order
    seconds: float  # the call's wall time, first forward to last
    forwards: int  # target forwards (prefills not counted)

    @property
    def new_tokens(self) -> int:
        return sum(len(g.tokens) for g in self.generations)


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


class Cohorts:
    """Each drafter's rows across the call's admissions (``Drafter.cohort``): a row's own view of every drafter of its
    pool, so a drafter that drafts many rows in one forward keeps one cache for all of them, admissions included. One
    row at a time (``width`` 1) plays the pool's drafters themselves."""

    def __init__(self, width: int):
        self.width = width
        self.of: dict[int, object] = {}

    def pool(self, pool: Mapping[str, Drafter], prompt: list[int]) -> dict[str, Drafter]:
        if self.width == 1:
            return dict(pool)
        out = {}
        for name, drafter in pool.items():
            if id(drafter) not in self.of:
                self.of[id(drafter)] = drafter.cohort()
            out[name] = self.of[id(drafter)].view(list(prompt))
        return out


def check_trees(selector: Selector, target: Target, method: str | None = None) -> None:
    """Refuse, before any decoding, a selector that verifies token trees on an encoder-decoder target, or on a model
    whose attention ignores a custom 4D mask (``check_tree_attention``)."""
    if selector.trees and target.is_encoder_decoder:
        what = f"method '{method}'" if method else type(selector).__name__
        raise SpecbenchError(
            f"{what} verifies several drafts as a token tree, which needs a decoder-only target; "
            f"this one is encoder-decoder ({type(target.model).__name__} places decoder tokens by "
            "cache position, not by position_ids)",
            "use fixed:<drafter> or a bandit selector (one draft a round) with this target",
        )
    if selector.trees:
        check_tree_attention(target.model, f"method '{method}'" if method else type(selector).__name__)


def decode_rows(
    target: Target,
    jobs: Sequence[Job],
    spec: DecodeSpec,
    rng: torch.Generator,
    *,
    width: int = 1,
    budget: BatchBudget | None = None,
    verifier: Verifier | None = None,
) -> BatchResult:
    """Decode every job's prompt, at most ``width`` at once (the module's docstring); ``verifier``: one made for
    ``target`` and this width before (a run's batches share one), else made now."""
    if not jobs:
        raise ValueError("no prompt to decode: at least one job")
    if width < 1:
        raise ValueError(f"at most {width} rows at once: at least 1")
    for selector in {id(j.player.selector): j.player.selector for j in jobs}.values():
        check_trees(selector, target)
        if selector.trees and spec.cascade is not None and not spec.cascade.lossless:
            raise rounds.cascade_with_tree(type(selector).__name__)
    verifier = verifier or verifier_for(target, width)
    clock = spec.clock
    cohorts = Cohorts(width)
    waiting, made, active = list(range(len(jobs))), {}, []
    start = clock.boundary()
    forwards = 0
    while active or waiting:
        while waiting and len(active) < width:
            i = waiting.pop(0)
            job = jobs[i]
            own = spec if job.limits is None else replace(spec, limits=job.limits)
            row = _admit(verifier, job, own, rng, cohorts)
            made[i] = row
            if row.done:  # nothing to generate (no new tokens asked): it leaves at once
                _finish(row, width)
                verifier.drop(list(range(len(active))))
                continue
            active.append(row)
        if not active:
            break
        # the forward each round was verified by, where a call decodes several prompts
        active = _round(verifier, active, budget, forwards if len(jobs) > 1 else None, width)
        forwards += 1
    seconds = clock.boundary() - start
    if len(jobs) == 1:  # one generation: its seconds run between the call's two boundaries
        made[0].gen.seconds = seconds
    return BatchResult([made[i].gen for i in range(len(jobs))], seconds, forwards)


def _admit(verifier: Verifier, job: Job, spec, rng, cohorts: Cohorts) -> Row:
    """A row made and prefilled: its selector reset (after its prompt's embedding, where it chooses by one), its
    drafters (``Cohorts``) and the target states they read recorded."""
    clock, selector = spec.clock, job.player.selector
    t0 = clock.now()
    pool = cohorts.pool(job.player.pool, job.prompt)
    watching, layers = listeners(pool, selector)
    started = verifier.admit(list(job.prompt), selector.embedding_pooling, layers)
    t_reset = clock.now()
    if started.embedding is not None:
        selector.set_embedding(started.embedding)
    selector.reset(job.query)
    t_reset = clock.now() - t_reset  # the selector's per-query work, counted in the first round's t_select
    ctx = DecodeContext(
        encoder_ids=started.encoder_ids,
        encoder_outputs=started.encoder_outputs,
        side_observations=selector.full_information,
        stream=spec.stream,
    )
    if layers:  # the target's states at the committed positions it has seen (all but the last token)
        ctx.record_states(started.states, rows=len(started.tokens) - 1, start=0)
    certify = spec.sampling.greedy and (spec.cascade is None or spec.cascade.lossless)
    gen = Generation(tokens=[], deciders=[] if certify else None)
    return Row(selector, pool, spec, rng, ctx, layers, watching, gen, list(started.tokens), t_reset, t0)


def _finish(row: Row, width: int) -> None:
    row.gen.seconds = row.spec.clock.now() - row.t0
    if width > 1:
        for drafter in row.pool.values():
            drafter.finish()


def _round(verifier: Verifier, active: list[Row], budget, forward: int | None, width: int) -> list[Row]:
    """One round of every active row around one forward (the module's docstring); the rows still generating."""
    clock = active[0].spec.clock
    for row in active:
        rounds.choose(row)
    _draft_all(active, budget)
    inputs = [rounds.scored(row) for row in active]
    layers = tuple(sorted({layer for row in active for layer in row.layers}))
    t0 = clock.now()
    forwards = verifier.score(inputs, layers)
    share = (clock.now() - t0) / len(active)
    kept, going = [], []
    for i, row in enumerate(active):
        turn = row.turn
        t1 = clock.now()
        states = {k: x for k, x in forwards[i].states.items() if k in row.layers}  # its own drafters' layers
        v = rounds.judge(row, forwards[i].logits, states)
        context = list(row.tokens) if row.watching and row.selector.full_information else []
        kept.append(rounds.commit(row, v))
        t2 = clock.now()
        side = rounds.side_observations(row, v, context)
        t3 = clock.now()
        t_select = turn.t_select + turn.t_plan + (t3 - t2) + (0.0 if row.gen.rounds else row.t_reset)
        rnd = rounds.record(row, v, t_select, share + (t2 - t1), forward)
        rounds.learn(row.selector, rnd, turn.members, turn.made, v, turn.choice)
        for name, side_bd in side.items():
            row.selector.observe(name, side_bd)
        if budget is not None and turn.planned is not None:
            budget.observe(v.arm, turn.made[v.arm].draft, v.accepted)
        if row.done:
            _finish(row, width)
        else:
            going.append(i)
    verifier.keep(kept, [row.tokens for row in active])
    if len(going) < len(active):
        verifier.drop(going)
    return [active[i] for i in going]


def _draft_all(active: list[Row], budget: BatchBudget | None) -> None:
    """Every row's drafts this round: rows whose drafter drafts many rows in one forward (``shared_rows``) together,
    the others alone (``rounds.draft``); under ``budget``, first whether any cap could pay (else no row drafts), then
    every chain cut to the cap."""
    if budget is not None:
        _check_budget_rows(active)
        asked = [
            (row.turn.choice, row.asked(row.turn.choice), row.pool[row.turn.choice].scored) for row in active
        ]
        if not budget.may_draft(
            [(a, k if row.pool[a].drafts else 0, s) for row, (a, k, s) in zip(active, asked)]
        ):
            for row, (arm, k, _) in zip(active, asked):
                drafts = row.pool[arm].drafts
                row.turn.members = (arm,)
                row.turn.made = {arm: Drafted(Draft([], None), 0, k if drafts else 0, False, 0.0, 0.0)}
            _plan(active, budget)
            return
    together: dict[int, list[Row]] = {}
    for row in active:
        choice = row.turn.choice
        shared = row.pool[choice].shared_rows if isinstance(choice, str) else None
        if shared is not None and row.asked(choice) > 0 and not row.lossy:
            together.setdefault(id(shared), []).append(row)
        else:
            rounds.draft(row)
    for group in together.values():
        _draft_together(group)
    if budget is not None:
        _plan(active, budget)


def _draft_together(group: list[Row]) -> None:
    """Rows drafting with views of one shared drafter: each synced, then one drafting forward a position for all of
    them (``SharedRows.propose``), each row timed at its share."""
    clock = group[0].spec.clock
    syncs, ks = [], []
    for row in group:
        drafter = row.pool[row.turn.choice]
        ta = clock.now()
        first = drafter.sync(row.ctx, row.tokens) and drafter.drafts
        syncs.append((first, clock.now() - ta))
        ks.append(row.asked(row.turn.choice))
    spec = group[0].spec
    t0 = clock.now()
    shared = group[0].pool[group[0].turn.choice].shared_rows
    drafts = shared.propose(
        [row.pool[row.turn.choice] for row in group],
        [row.tokens for row in group],
        ks,
        spec.sampling,
        group[0].rng,
        spec.eos_ids,
    )
    share = (clock.now() - t0) / len(group)
    for row, d, k, (first, t_sync) in zip(group, drafts, ks, syncs):
        arm = row.turn.choice
        row.turn.members, row.turn.made = (arm,), {arm: Drafted(d, k, k, first, t_sync, share)}


def _check_budget_rows(active: list[Row]) -> None:
    for row in active:
        choice = row.turn.choice
        if not isinstance(choice, str):
            raise SpecbenchError(
                f"a row chose {choice!r} under the batch budget, which plans one drafter's chain a row",
                "give the batch budget fixed drafters (goodput:<drafter>), or drop the budget",
            )


def _plan(active: list[Row], budget: BatchBudget) -> None:
    """Every row's chain (a tree draft's first path) cut to the budget's cap; each row's share of its plan."""
    chains = []
    for row in active:
        arm = row.turn.members[0]
        made = row.turn.made[arm]
        if made.draft.scores is not None and not row.pool[arm].scored:
            raise SpecbenchError(
                f"drafter {arm!r} ({type(row.pool[arm]).__name__}) drafted with scores but does not declare "
                "scored = True: the batch budget bounds its acceptance before it drafts by its depth alone",
                f"set scored = True on {type(row.pool[arm]).__name__} (its drafts carry Draft.scores)",
            )
        chains.append((arm, first_path(made.draft)))
    cap, expected, seconds = budget.plan(chains)
    for row, (arm, chain), e in zip(active, chains, expected):
        made = row.turn.made[arm]
        cut = keep_tokens(chain, range(min(cap, len(chain.tokens), made.k)))
        row.turn.made = {arm: replace(made, draft=cut)}
        row.turn.planned = (e, seconds / len(active))


__all__ = [
    "Admitted",
    "BatchResult",
    "Cohorts",
    "Job",
    "OneRow",
    "Player",
    "Rows",
    "Turn",
    "Verifier",
    "check_trees",
    "decode_rows",
    "listeners",
    "verifier_for",
]
