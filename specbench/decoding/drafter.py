"""The drafter protocol the decode loop speaks, beside the loop (``decoding`` never imports ``drafters``).

A drafter is touched only in the rounds that play it: the loop calls ``sync`` then ``propose`` on
the chosen arm and nothing on the others, so a drafter's per-query setup (an encoder pass, a prompt
prefill) happens lazily, the first time it is synced in a query, and is timed in that round as its
first-use cost. The one exception is the verification hook (``observe``): under a full-information selector
(``selector.full_information``), a drafter that declares ``state_layers`` is shown what each target verification
forward computed, played or not; under bandit feedback ``observe`` is never called. Drafters whose observations
share work declare an ``ObservationGroup``, which the loop calls once per verification forward.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from specbench.arms import (
    AUTOREGRESSIVE,
)  # the pool key of the no-draft arm (ground floor: selection uses it too)
from specbench.decoding.sampling import SamplingParams, pick
from specbench.errors import SpecbenchError


@dataclass
class Draft:
    tokens: list[int]
    probs: torch.Tensor | None  # [len(tokens), V]: the distributions the tokens were drawn from
    raw: torch.Tensor | None = None  # [len(tokens), V]: the drafter's untempered softmax (cascade rules)
    # retrieval drafters: how many context tokens the draft's source matched (routing)
    match: int | None = None
    # A tree draft (dynamic draft trees, a retrieval drafter's several continuations): each token's parent index
    # in ``tokens`` (-1: it follows the committed tokens); parents precede children; ``probs[i]`` is the
    # distribution token ``i`` was drawn from (its parent's). None: a chain, token i follows token i - 1.
    parents: list[int] | None = None
    # the drafter's own estimate, per token, that the target accepts the path to it (a path probability, a
    # retrieval frequency): what a cost-model budget calibrates and ranks nodes by. None: not estimated.
    scores: list[float] | None = None

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    def depth(self) -> int:
        """Tokens on its longest path (its length for a chain)."""
        if self.parents is None:
            return len(self.tokens)
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return max(depths, default=0)


def full_precision(*modules: torch.nn.Module | None) -> bool:
    """Whether every floating parameter of ``modules`` is float32 or wider: a forward over many tokens at once then
    computes what one token at a time computes (to fp32 rounding), so a drafter of them is history-free; in bf16 or
    fp16 a multi-token catch-up rounds differently from single-token steps, and its drafts can differ."""
    return all(
        p.dtype in (torch.float32, torch.float64)
        for m in modules
        if m is not None
        for p in m.parameters()
        if p.is_floating_point()
    )


def keep_tokens(draft: Draft, keep) -> Draft:
    """``draft`` cut to the token indices ``keep`` (closed under parents: a kept token's parent is kept), in draft
    order, re-indexed; a chain stays a chain when ``keep`` is one of its prefixes."""
    keep = sorted(set(int(i) for i in keep))
    if keep == list(range(len(draft.tokens))):
        return draft
    where = {old: new for new, old in enumerate(keep)}
    parents = draft.parents if draft.parents is not None else list(range(-1, len(draft.tokens) - 1))
    if any(parents[i] >= 0 and parents[i] not in where for i in keep):
        raise ValueError(f"kept draft tokens {keep} leave out a parent (parents {parents})")
    new_parents = [where[parents[i]] if parents[i] >= 0 else -1 for i in keep]
    chain = draft.parents is None and new_parents == list(range(-1, len(keep) - 1))

    def rows(x):
        return None if x is None else x[keep] if keep else None

    return Draft(
        tokens=[draft.tokens[i] for i in keep],
        probs=rows(draft.probs),
        raw=rows(draft.raw),
        match=draft.match,
        parents=None if chain else new_parents,
        scores=None if draft.scores is None else [draft.scores[i] for i in keep],
    )


def draft_ends(tok: int, prob: float, i: int, k: int, eos_ids, confidence_threshold: float) -> bool:
    """Whether a draft stops after its ``i``-th token: at EOS, at ``k`` tokens, or when the drafter
    doubts its own token (probability below ``confidence_threshold``: it would likely be rejected,
    and each further draft forward costs time). Verification is unchanged, so decoding stays lossless."""
    return tok in eos_ids or i == k - 1 or prob < confidence_threshold


@dataclass
class DraftSteps:
    """A chain draft picked a token at a time, as every chain drafter picks it, alone or for a batch's rows: each
    token from its position's logits (greedy) or processed probabilities (sampling), kept with both distributions
    (``Draft.probs`` and the untempered ``Draft.raw``)."""

    tokens: list[int] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)
    raw: list[torch.Tensor] = field(default_factory=list)

    def pick(self, logits, probs, sampling: SamplingParams, rng, stop_below: float = 0.0) -> int | None:
        """The next token from a position's ``logits`` and their processed ``probs``, appended; None when the
        untempered top probability is below ``stop_below`` (a sequential cascade defers the position to the
        target)."""
        untempered = probs if sampling.greedy else torch.softmax(logits.float(), dim=-1)
        if stop_below and float(untempered.max()) < stop_below:
            return None
        tok = pick(logits if sampling.greedy else probs, sampling, rng)
        self.tokens.append(tok)
        self.rows.append(probs)
        self.raw.append(untempered)
        return tok

    def ends(self, k: int, eos_ids, confidence_threshold: float) -> bool:
        """Whether the draft stops after its last token (``draft_ends``)."""
        tok = self.tokens[-1]
        return draft_ends(
            tok, float(self.rows[-1][tok]), len(self.tokens) - 1, k, eos_ids, confidence_threshold
        )

    def draft(self) -> Draft:
        return Draft(
            self.tokens,
            torch.stack(self.rows) if self.rows else None,
            raw=torch.stack(self.raw) if self.raw else None,
        )


@dataclass
class DecodeContext:
    """One decode call's per-query context, handed to ``sync``.

    ``encoder_ids``: the prompt as the target's encoder saw it (encoder-decoder targets; None for
    decoder-only ones). ``encoder_outputs``: the target's own encoder output for them, which a
    drafter sharing the target's encoder reuses instead of encoding again. A new ``DecodeContext`` object
    starts a new query: a drafter compares it by identity to the one it last saw.

    The loop also keeps here what the target computed at the committed positions for the layers
    the pool asked for (``state_layers``): ``states(layer)`` is ``[n, H]``, the residual stream
    after ``layer`` layers at committed positions ``0 .. n - 1``, filled from the prefill and from
    each verification forward (its accepted rows). A drafter reads it when it is synced, so
    feature-level draft heads need no second target pass and do no work in rounds they do not play.
    """

    encoder_ids: list[int] | None = None
    encoder_outputs: object = None
    side_observations: bool = False  # the selector wants side observations this query (``observe``)
    # the stream this decode belongs to (an eval method's name), for drafters that remember earlier generations of
    # the same stream (``drafters/suffix.py``); None: remember nothing (warm-ups, traces, direct calls)
    stream: str | None = None
    _chunks: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def record_states(self, states: Mapping[int, torch.Tensor], rows: int, start: int) -> None:
        """Keep ``rows`` rows of ``states`` as committed positions ``start ..`` (dropping any past ``start``)."""
        for layer, x in states.items():
            chunks = self._chunks.setdefault(layer, [])
            have = sum(c.shape[0] for c in chunks)
            if have > start:  # positions past ``start`` were never committed: drop them
                kept = torch.cat(chunks)[:start] if chunks else x[:0]
                chunks[:] = [kept] if kept.shape[0] else []
            elif have < start:
                raise ValueError(f"states recorded up to position {have}, then from {start}")
            chunks.append(x[:rows])

    def states(self, layer: int) -> torch.Tensor:
        """``[n, H]``: the target's states after ``layer`` layers at every committed position recorded so far."""
        chunks = self._chunks.get(layer)
        if not chunks:
            raise KeyError(f"no target states were recorded for layer {layer}: declare it in state_layers")
        if len(chunks) > 1:
            chunks[:] = [torch.cat(chunks)]
        return chunks[0]


@dataclass
class Verification:
    """What one target verification forward computed (handed to ``Drafter.observe``).

    ``draft``: the scored draft tokens (``len(draft) + 1`` positions were scored: the last committed
    token, then the draft);
    ``p``: the target's processed distributions at the drafted positions ``[len(draft), V]`` (None
    when nothing was drafted); ``accepted``: how many draft tokens verification kept; ``states``: ``{layer: [len(draft) + 1, H]}`` residual stream after
    ``layer`` layers at the scored positions, for the layers some drafter asked for; ``played``:
    the arm that drafted; ``shared``: what each observation group computed for this forward
    (``{group: {member name: observation}}``), filled by ``observations`` before any member's ``observe``.

    For drafters that must replay the round on their own state (draft heads): ``context``, the
    committed tokens before the round (the last of them is the first scored position); ``query``,
    the decode's ``DecodeContext`` (its recorded target states); ``draft_length``, the run's draft length;
    ``room``, the most tokens any draft could have had this round (``max_new_tokens`` left, less the
    bonus token); ``eos_ids``, the tokens that end a draft. None where the caller did not fill them.
    """

    draft: list[int]
    p: torch.Tensor | None
    accepted: int
    played: str
    sampling: SamplingParams
    states: dict[int, torch.Tensor] = field(default_factory=dict)
    shared: dict[ObservationGroup, Mapping[str, float]] = field(default_factory=dict)
    context: list[int] | None = None
    query: DecodeContext | None = None
    draft_length: int | None = None
    room: int | None = None
    eos_ids: frozenset[int] = frozenset()


class ObservationGroup:
    """Drafters whose side observations share work (draft heads scoring through one LM head, early exits reading
    one LM head) declare one group: ``Drafter.group``, equal for all of them (a frozen dataclass over what they
    share). Once per verification forward, before any member's own ``observe``, ``observations`` calls the group's
    ``observe`` with its members that watch that forward; each member's ``observe`` then reads its own entry
    (``Verification.shared``)."""

    def observe(self, verification: Verification, members: Mapping[str, Drafter]) -> Mapping[str, float]:
        """``{member name: side observation}`` for the members that have one this round (not the played one)."""
        raise NotImplementedError


class Drafter:
    """A source of draft tokens. The decode loop (``decoding/loop.py``; the trace walk, ``decoding/trace.py``, alike)
    calls these four methods and no other:

    - ``state_layers(side_observations)``: once per decode call, before the prefill (``listeners``), on each drafter
      the selector can play (every drafter under full information): the target layers whose hidden states it wants
      recorded at the committed positions (``DecodeContext.states``) and, under full information, handed to
      ``observe``. None by default, and then the target runs without returning them.
    - ``sync(query, tokens)``: in each round that drafts with it (the played arm, each member of a tree round, a
      ``Route``'s first arm), first: catch up with the committed ``tokens``. It calls ``begin(query)`` when ``query``
      is a new ``DecodeContext`` (the drafter's first use in the query), then ``catch_up(tokens)``; True on that
      first use.
    - ``propose(tokens, k, sampling, rng, eos_ids[, stop_below])``: right after ``sync``, unless no room is left:
      up to ``k`` draft tokens.
    - ``observe(verification)``: after each verification forward, only under a full-information selector and only
      on drafters whose ``state_layers(True)`` is not empty, through ``observations``: each declared ``group``
      (``ObservationGroup``) does its members' shared work once, then each drafter's ``observe`` returns its side
      observation (the Block Divergence it would have had), which counts only for drafters the round did not play.

    It reads two attributes: ``draft_length`` (tokens per round; None: the run's ``decoding.draft_length``) and
    ``drafts`` (False only for the autoregressive arm: a round of it drafts nothing and has no reward); ``group``
    through ``observations``. ``begin`` and ``catch_up`` are ``sync``'s steps, for drafters to override. The rest
    serves the pipelines, selectors and traces, never the loop: ``name``, ``cost`` (the relative cost per drafted
    token: parameter count relative to the target by default), ``deterministic``, ``history_free``,
    ``standalone_model`` / ``can_generate_alone``.
    """

    name: str = "drafter"
    cost: float = 0.0
    draft_length: int | None = None  # tokens drafted per round; None: the run's decoding.draft_length
    deterministic: bool = False
    # its drafts and their distributions at a position depend on the committed tokens alone, not on how it caught
    # up with them (one token at a time or many at once): what makes a trace replay it exactly (decoding/trace.py)
    history_free: bool = True
    drafts: bool = True
    # its drafts may carry ``Draft.scores`` (what a budget calibrates by score bin); False: never, so a batch budget
    # bounds a draft's acceptance by its depth before it is drafted (``BatchBudget.may_draft``)
    scored: bool = False
    # a row's view of a drafter that drafts many rows of a batch in one forward (``drafters/batched.py``): the loop
    # asks it for every such row at once (``ModelRows.propose``); None: each row drafts on its own
    shared_rows = None
    # the drafters it shares observation work with (``ObservationGroup``)
    group: ObservationGroup | None = None

    _query: DecodeContext | None = None

    def begin(self, query: DecodeContext) -> None:
        """Start a query (drafters with per-query state override this). The loop never calls it: ``sync`` does,
        the first time it meets a query."""

    def sync(self, query: DecodeContext, tokens: list[int]) -> bool:
        """Catch up with ``tokens``; returns True when this call started the query (first use)."""
        first = query is not self._query
        if first:
            self._query = query
            self.begin(query)
        self.catch_up(tokens)
        return first

    def catch_up(self, tokens: list[int]) -> None:
        """Bring the drafter's own state (a KV cache) up to the committed ``tokens``."""

    def propose(
        self,
        tokens: list[int],
        k: int,
        sampling: SamplingParams,
        rng: torch.Generator,
        eos_ids: frozenset[int] = frozenset(),
        stop_below: float = 0.0,
    ) -> Draft:
        """Up to ``k`` draft tokens after the committed ``tokens``. ``stop_below``: end the draft before a position
        whose largest untempered probability is below it (where a sequential cascade defers to the target, which
        then gives that token: ``Cascade.stop_below``); drafters without a distribution ignore it."""
        raise NotImplementedError

    def for_row(self) -> Drafter:
        """A drafter of the same settings for one row of a batch (``decoding/engine.py``), with per-query state of its
        own (a batch drafts for several queries at once). A kind that says nothing of it cannot draft in a batch."""
        raise SpecbenchError(
            f"drafter '{self.name}' ({type(self).__name__}) cannot draft in a batch yet: batched decoding takes "
            "prompt lookup, the retrieval drafter, model drafters and draft heads drafting chains and the "
            "autoregressive arm",
            f"decode with decoding.batch_size=1, or use methods whose drafters batch (not '{self.name}')",
        )

    def cohort(self) -> Cohort:
        """The drafter's rows in one call of the loop (``Cohort``): by default a ``for_row`` each; a kind that drafts
        many rows in one forward gives views of one shared state, admissions included (``ModelDrafter``)."""
        return Cohort(self)

    def finish(self) -> None:
        """A row of a batch finished its generation (``decoding/engine.py``): drafters with memory keep it now."""

    def standalone_model(self) -> torch.nn.Module | None:
        """A model of the drafter's own that can generate without the target (its "alone" output), or None."""
        return None

    @property
    def can_generate_alone(self) -> bool:
        return self.standalone_model() is not None

    def state_layers(self, side_observations: bool) -> tuple[int, ...]:
        return ()

    def observe(self, verification: Verification) -> float | None:
        """Its side observation of a round it did not play: by default its entry of what its ``group`` computed for
        this forward (None without a group)."""
        if self.group is None:
            return None
        return verification.shared.get(self.group, {}).get(self.name)


class Cohort:
    """A drafter's rows in one call of the loop: ``view(prompt)`` gives a row that joins its own drafter (by default
    the drafter's ``for_row``; a shared kind's view of its one batched state)."""

    def __init__(self, drafter: Drafter):
        self.drafter = drafter

    def view(self, prompt: list[int]) -> Drafter:
        return self.drafter.for_row()


def observations(watching: Mapping[str, Drafter], verification: Verification) -> dict[str, float | None]:
    """Every watching drafter's ``observe`` of one verification forward, in ``watching``'s order: each group's shared
    work first, once per group (``ObservationGroup.observe`` with its members in ``watching``), then each drafter's
    own ``observe``. The loop and the trace (``decoding/trace.py``) both observe through it."""
    groups: dict[ObservationGroup, dict[str, Drafter]] = {}
    for name, d in watching.items():
        if d.group is not None:
            groups.setdefault(d.group, {})[name] = d
    verification.shared = {group: group.observe(verification, members) for group, members in groups.items()}
    return {name: d.observe(verification) for name, d in watching.items()}


class AutoregressiveArm(Drafter):
    """No draft: the round is one ordinary target step."""

    name = AUTOREGRESSIVE
    deterministic = True
    drafts = False

    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset(), stop_below=0.0) -> Draft:
        return Draft(tokens=[], probs=None)

    def for_row(self) -> Drafter:
        return self  # no state
