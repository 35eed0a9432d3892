"""The selector interface: ``reset`` per query, ``select`` then ``update`` per speculative round."""

from __future__ import annotations

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


@dataclass(frozen=True)
class Route:
    """A per-round routing choice (the SAM-Decoding rule): the loop drafts with ``first``; its draft plays
    when its context match (``Draft.match``) is at least ``min_match`` tokens long, else ``then`` drafts
    instead: one arm, or several whose drafts one forward verifies as a token tree (``first`` among them
    keeps the draft it already made)."""

    first: str
    then: str | tuple[str, ...]
    min_match: int


class Selector:
    """Chooses which arm (a pool key, ``autoregressive`` included) drafts each round.

    ``embedding_pooling``: when set, the loop embeds each prompt with the target (timed as part of
    decoding) and passes it to ``set_embedding`` before ``reset``.
    ``full_information``: the selector also wants ``observe`` calls, one per early-exit arm it did
    not play, with that arm's Block Divergence read off the target's verification forward.
    """

    full_information: bool = False
    trees: bool = False  # may choose several arms a round (a token tree): decoder-only targets only
    embedding_pooling: str | None = None  # set by selectors that read the query's embedding (``set_embedding``)
    randomized: bool = False  # draws from its own seeded rng (a replay runs it once per seed; the others are deterministic)

    def __init__(self, arms: list[str]):
        self.arms = list(arms)

    def playable(self) -> list[str]:
        """The arms this selector may play in a generation (all of its arms unless it is pinned to one)."""
        return list(self.arms)

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
