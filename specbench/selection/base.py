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


class Selector:
    """Chooses which arm (a pool key, ``autoregressive`` included) drafts each round."""

    def __init__(self, arms: list[str]):
        self.arms = list(arms)

    def reset(self, query=None) -> None:
        """Start a new query (per-query selectors decide here)."""

    def select(self) -> str:
        raise NotImplementedError

    def update(self, arm: str, feedback: Feedback) -> None:
        """Learn from the round just played (online selectors)."""
