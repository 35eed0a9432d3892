"""Drafter selectors: per query (fixed, oracle, policy) or per round (bandits)."""

from specbench.selection.base import Feedback, Selector
from specbench.selection.fixed import Fixed

__all__ = ["Feedback", "Fixed", "Selector"]
