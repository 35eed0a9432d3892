"""Drafter selectors: per query (fixed, oracle, policy) or per round (bandits)."""

from specbench.selection.bandits import BanditSelector, EpsilonGreedy, RandomSelector
from specbench.selection.base import Feedback, Plan, Route, Selector
from specbench.selection.budget import Budget
from specbench.selection.exp3 import EXP3
from specbench.selection.explore_commit import ExploreThenCommit
from specbench.selection.fixed import Fixed
from specbench.selection.halving import SequentialHalving
from specbench.selection.hedge import Hedge
from specbench.selection.policy import PolicySelector
from specbench.selection.trees import FixedTree, Router, TreeHedge, TreeUCB
from specbench.selection.ucb import UCB, DiscountedUCB, SlidingWindowUCB

__all__ = [
    "BanditSelector",
    "Budget",
    "Plan",
    "DiscountedUCB",
    "EXP3",
    "EpsilonGreedy",
    "ExploreThenCommit",
    "Feedback",
    "Fixed",
    "FixedTree",
    "Hedge",
    "PolicySelector",
    "RandomSelector",
    "Route",
    "Router",
    "Selector",
    "SequentialHalving",
    "SlidingWindowUCB",
    "TreeHedge",
    "TreeUCB",
    "UCB",
]

# each selector class by the ``_target_`` a config names it with (conf/selector/): what the command line checks a
# selector config against (the keys its signature declares) before any model loads
TARGETS = {
    f"{__name__}.{cls.__name__}": cls
    for cls in (
        Budget,
        DiscountedUCB,
        EXP3,
        EpsilonGreedy,
        ExploreThenCommit,
        Fixed,
        Hedge,
        PolicySelector,
        RandomSelector,
        Router,
        SequentialHalving,
        SlidingWindowUCB,
        TreeHedge,
        TreeUCB,
        UCB,
    )
}
