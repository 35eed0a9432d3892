"""A batch's drafting step (``decoding/batch.py``): each row's draft this round, a ``Turn``.

A row that plays one drafter drafts a chain with it (a retrieval drafter's tree draft cut to its first path); rows
whose drafter drafts many rows in one forward (``Drafter.shared_rows``: model drafters and draft heads) draft
together. A row whose selector chose more than one arm resolves its choice as the single-query loop does
(``rounds.round_members``, with the loop's own ``Drafted`` records): a ``Route`` drafts its first drafter and keeps
that draft when its match is long enough, else drafts with the route's fallback (one drafter: a chain; several: a
tree); a tuple of arms drafts with each, and their drafts (each whole, a retrieval tree included) become one token
tree (``tree.build_tree``) that the batch verifies as that row's input. Under the batch budget no row drafts when,
before any row drafts, no cap could pay (``BatchBudget.may_draft``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from specbench.decoding.drafter import Draft, keep_tokens
from specbench.decoding.rounds import Drafted, matched, round_members
from specbench.decoding.tree import TokenTree, build_tree

if TYPE_CHECKING:
    from specbench.decoding.batch import _Row
    from specbench.decoding.loop import DecodeSpec
    from specbench.selection.batch_budget import BatchBudget


@dataclass(frozen=True)
class Turn:
    """A row's draft this round: one drafter's chain (``draft``, its length limit ``n_max``: 0 for the
    autoregressive arm), or a token tree over several drafters' drafts (``tree``, each member's ``Drafted`` in
    ``made``), with the seconds its drafting took (a draft routed away included)."""

    draft: Draft
    n_max: int
    seconds: float
    tree: TokenTree | None = None
    made: dict[str, Drafted] | None = None

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(self.made or ())

    @property
    def tokens(self) -> list[int]:
        """The row's input after its last committed token: the chain, or the tree's nodes."""
        return list(self.tree.tokens) if self.tree is not None else list(self.draft.tokens)


NONE = Turn(Draft([], None), 0, 0.0)


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


def drafts(
    active: list[_Row], spec: DecodeSpec, rng: torch.Generator, budget: BatchBudget | None
) -> list[Turn]:
    """Every row's ``Turn`` this round (see the module's docstring); shared rows each timed at their share of their
    drafting."""
    asked = [_asked(row, spec) for row in active]
    turns = [replace(NONE, n_max=k) for k in asked]
    if budget is not None and not budget.may_draft(
        [(r.arm, k, r.drafter.scored) for r, k in zip(active, asked)]
    ):
        return turns
    together: dict[int, list[int]] = {}
    for i, (row, k) in enumerate(zip(active, asked)):
        if not isinstance(row.choice, str):
            turns[i] = _resolve(row, spec, rng)
        elif k > 0 and row.drafter.shared_rows is not None:
            together.setdefault(id(row.drafter.shared_rows), []).append(i)
        elif k > 0:
            made, seconds = _proposed(row, k, spec, rng)
            turns[i] = Turn(_chain(made, k), k, seconds)
    clock = spec.clock
    for rows in together.values():
        t0 = clock.now()
        shared = active[rows[0]].drafter.shared_rows
        for i in rows:  # each row's query (a head reads its row's target states)
            active[i].drafter.sync(active[i].query, active[i].tokens)
        made = shared.propose(
            [active[i].drafter for i in rows],
            [active[i].tokens for i in rows],
            [asked[i] for i in rows],
            spec.sampling,
            rng,
            spec.eos_ids,
        )
        share = (clock.now() - t0) / len(rows)
        for i, d in zip(rows, made):
            turns[i] = Turn(_chain(d, asked[i]), asked[i], share)
    return turns


def _asked(row: _Row, spec: DecodeSpec) -> int:
    """The tokens the row's drafter is asked for this round: its draft length, no more than the room its
    ``max_new_tokens`` leaves beside the bonus token (the round's ``n_max``); 0 for an arm that drafts nothing."""
    limits = spec.limits
    room = limits.max_new_tokens - len(row.gen.tokens) - 1
    return max(min(row.drafter.draft_length or limits.draft_length, room), 0) if row.drafter.drafts else 0


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


def _resolve(row: _Row, spec: DecodeSpec, rng: torch.Generator) -> Turn:
    """A row whose selector chose a route or several arms: its members drafted as the single-query loop drafts them
    (``round_members``); one member plays its chain (the row's arm becomes it), several their token tree."""

    def draft_with(name: str) -> Drafted:
        row.arm = name
        k = _asked(row, spec)
        made, seconds = _proposed(row, k, spec, rng)
        return Drafted(made, k, k, False, 0.0, seconds)

    members, made, unused = round_members(
        row.choice,
        draft_with,
        matched,
        type(row.selector).__name__,
    )
    seconds = sum(d.t_propose for d in made.values()) + (unused.t_propose if unused is not None else 0.0)
    row.arm = members[0]
    if len(members) == 1:
        played = made[members[0]]
        return Turn(_chain(played.draft, played.k), played.n_max, seconds)
    tree = build_tree(
        {m: d.draft.tokens for m, d in made.items()}, {m: d.draft.parents for m, d in made.items()}
    )
    return Turn(Draft([], None), max(d.n_max for d in made.values()), seconds, tree, dict(made))
