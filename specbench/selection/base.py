"""The selector interface: ``reset`` per query, ``select`` then ``update`` per speculative round."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Feedback:
    """What one round tells a selector about the arm it played.

    ``be`` is Block Efficiency (accepted / n_max) and ``bd`` Block Divergence
    ((1 / n_max) * sum over drafted positions of 1 - TV(p, q)); both lie in [0, 1].
    """

    drafted: int
    accepted: int
    n_max: int
    be: float
    bd: float
    t_draft: float
    t_verify: float
    t_switch: float
    # the arm's verified draft tokens whose parent was accepted (or that follow the committed tokens), each as
    # (draft index, accepted): the observations a per-node acceptance calibration learns from
    nodes: tuple[tuple[int, bool], ...] = ()


def feedback_of(rnd, nodes: tuple[tuple[int, bool], ...] = ()) -> Feedback:
    """A played round's record (``records.Round``) as the feedback its arm's selector learns from."""
    return Feedback(
        drafted=rnd.drafted,
        accepted=rnd.accepted,
        n_max=rnd.n_max,
        be=rnd.be,
        bd=rnd.bd,
        t_draft=rnd.t_draft,
        t_verify=rnd.t_verify,
        t_switch=rnd.t_switch,
        nodes=tuple(nodes),
    )


@dataclass(frozen=True)
class Plan:
    """A round built by a cost model (``selection/budget.py``): the loop drafts with ``first`` (cheap drafters),
    asks ``more(drafts)`` which further drafters draft (given ``{name: Draft}`` so far), then
    ``prune(drafts)`` which of all their tokens enter the verified tree (``{name: kept draft indices}``, each
    kept set closed under parents). ``estimate()`` after pruning: ``(expected accepted tokens, predicted
    seconds)`` of the round, recorded beside what it measured. ``label``: what decided the round (the budget's
    ``plan``, a ``probe:<arm>`` of one drafter alone, or ``floor:<arm>`` where that arm's measured goodput
    overruled the plan), recorded as ``Round.decided``; ``settle(round)``: given the round's record once it is
    measured (its emitted tokens and seconds)."""

    first: tuple[str, ...]
    more: Callable
    prune: Callable
    estimate: Callable
    label: str = "plan"
    settle: Callable | None = None


@dataclass(frozen=True)
class Route:
    """A per-round routing choice (the SAM-Decoding rule): the loop drafts with ``first``; its draft plays
    when its context match (``Draft.match``) is at least ``min_match`` tokens long, else ``then`` drafts
    instead: one arm, or several whose drafts one forward verifies as a token tree (``first`` among them
    keeps the draft it already made)."""

    first: str
    then: str | tuple[str, ...]
    min_match: int
    # SuffixDecoding's hybrid: the first draft plays only when its expected accepted tokens (the sum of its own
    # per-token scores, ``Draft.scores``) are at least this too; None: the match length alone decides
    min_expected: float | None = None


class Selector:
    """Chooses which arm (a pool key, ``autoregressive`` included) drafts each round.

    ``embedding_pooling``: when set, the loop embeds each prompt with the target (timed as part of
    decoding) and passes it to ``set_embedding`` before ``reset``.
    ``full_information``: the selector also wants ``observe`` calls, one per early-exit arm it did
    not play, with that arm's Block Divergence read off the target's verification forward.
    """

    full_information: bool = False
    trees: bool = False  # may choose several arms a round (a token tree): decoder-only targets only
    routes: bool = False  # chooses a ``Route`` (the drafter that plays depends on the first draft's match)
    plans: bool = False  # chooses a ``Plan`` (a cost model builds the round from its drafters' drafts)
    # set by selectors that read the query's embedding (``set_embedding``)
    embedding_pooling: str | None = None
    # draws from its own seeded rng (a replay runs it once per seed; the others are deterministic)
    randomized: bool = False
    # arms in every round's tree by construction, never by choice (a subset selector's ``always``, a fixed tree's
    # members): a round's share on the best drafter counts only the members it chose
    fixed_members: tuple[str, ...] = ()
    # chooses by the query's embedding from the target (the offline policy): traces cannot replay it, and a run of
    # it may take its pool from its checkpoint (read through ``context_aware``, not by the class's name)
    context_aware: bool = False

    def __init__(self, arms: list[str]):
        self.arms = list(arms)

    def playable(self) -> list[str]:
        """The arms this selector may play in a generation (all of its arms unless it is pinned to one)."""
        return list(self.arms)

    def at(self, context: int) -> None:
        """The row's context length (its committed tokens: the prompt and the output so far), told before each
        ``select`` (a cost model prices a round by it)."""

    def set_embedding(self, embedding) -> None:
        """The query's embedding from the target (``Target.embed``), given before ``reset``."""

    def reset(self, query=None) -> None:
        """Start a new query (per-query selectors decide here)."""

    def select(self) -> str | tuple[str, ...] | Route:
        """This round's arm; or a tuple of arms whose drafts enter one token tree; or a ``Route``."""
        raise NotImplementedError

    def update_tree(self, feedback: dict[str, Feedback]) -> None:
        """Learn from a tree round: every member's own feedback (its accepted length and rewards along its
        own path in the tree forward, as if it had drafted alone)."""

    def update(self, arm: str, feedback: Feedback) -> None:
        """Learn from the round just played (online selectors)."""

    def observe(self, arm: str, bd: float) -> None:
        """A side observation: the Block Divergence arm ``arm`` would have had this round (not played)."""


def context_aware(target) -> bool:
    """Whether the selector class a config's ``_target_`` names reads the query's embedding (``Selector.context_aware``);
    False for a name that is not a selector class."""
    if not target:
        return False
    from hydra.utils import get_class

    try:
        cls = get_class(str(target))
    except Exception:  # noqa: BLE001 - not a class path: not a context-aware selector
        return False
    return isinstance(cls, type) and issubclass(cls, Selector) and bool(cls.context_aware)
