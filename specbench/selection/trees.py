"""Selectors that verify several drafts in one target forward (token trees), and the per-round router.

- ``FixedTree``: the same members every round (``tree:<a>+<b>`` methods; ``tree:*`` is the whole pool,
  whose rounds record every drafter's accepted length: the per-round oracle in hindsight).
- ``TreeUCB`` / ``TreeHedge`` (subset selectors): each round the ``always`` arms (prompt lookup: its
  drafting is nearly free) plus ``size`` arms chosen by the bandit: the highest UCB indices, or a
  draw without replacement from Hedge's weights. One forward scores every member's draft, so every
  member is observed every round: each one's reward (BD or BE of its own draft along its own rows of
  the tree forward) updates its statistics as a pull would. The tree's accepted length is the best
  member's, so choosing a weak extra member costs only its drafting and a larger verification.
- ``Router`` (the SAM-Decoding rule): prompt lookup's draft when its suffix match is at least
  ``min_match`` tokens long, else the ``fallback`` drafter's (a named arm, or, when ``fallback`` is
  null, the one UCB picks among the other drafters, learning from the rounds it plays); with ``min_expected``
  (SuffixDecoding's hybrid) the retrieval draft must also expect at least that many accepted tokens by its own
  scores (a retrieval drafter's frequencies: ``drafters/suffix.py``). With ``tree``
  the fallback round verifies prompt lookup's (short-match) draft and the fallback's in one tree.
"""

from __future__ import annotations

from typing import Annotated

from specbench.arms import AUTOREGRESSIVE
from specbench.errors import SpecbenchError
from specbench.selection.base import Feedback, Route, Selector
from specbench.selection.hedge import Hedge
from specbench.selection.ucb import UCB
from specbench.validate import boolean, declared, integer, list_of, mapping, number, text


def _check_arms(kind: str, names, arms: list[str], what: str) -> list[str]:
    names = [str(a) for a in (names or [])]
    unknown = [a for a in names if a not in arms]
    if unknown:
        raise SpecbenchError(
            f"{kind}: no arm named {', '.join(unknown)} in the pool ({what})",
            f"use drafters from: {', '.join(a for a in arms if a != AUTOREGRESSIVE)}",
        )
    if AUTOREGRESSIVE in names:
        raise SpecbenchError(
            f"{kind}: the autoregressive arm drafts nothing, so it cannot enter a tree ({what})",
            "list drafters only",
        )
    return list(dict.fromkeys(names))


class FixedTree(Selector):
    """Every round, the drafts of ``members`` enter one token tree."""

    def __init__(self, arms: list[str], members: list[str]):
        super().__init__(arms)
        self.members = tuple(_check_arms("tree", members, self.arms, "members"))
        if not self.members:
            raise SpecbenchError("tree: no members", "name at least one drafter: tree:<a>+<b>")
        self.trees = len(self.members) > 1

    def select(self) -> tuple[str, ...]:
        return self.members

    def playable(self) -> list[str]:
        return list(self.members)

    @property
    def fixed_members(self) -> tuple[str, ...]:
        return self.members


def _split(kind: str, arms: list[str], always, candidates) -> tuple[list[str], list[str]]:
    fixed = _check_arms(kind, always, arms, "always")
    if candidates is None:
        rest = [a for a in arms if a != AUTOREGRESSIVE and a not in fixed]
    else:
        rest = [a for a in _check_arms(kind, candidates, arms, "candidates") if a not in fixed]
    if not rest:
        raise SpecbenchError(
            f"{kind}: no drafter left to choose besides {', '.join(fixed) or 'nothing'}",
            "add drafters to the pool, or list candidates",
        )
    return fixed, rest


def _check_size(kind: str, size, rest: list[str]) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= len(rest):
        raise SpecbenchError(
            f"{kind}: size {size!r} must be a whole number between 1 and {len(rest)} "
            "(the drafters it chooses among)",
            f"set size to 1..{len(rest)}",
        )
    return size


class _TreeSubset:
    """What the subset selectors share: ``always`` drafters in every tree, ``size`` more chosen by the bandit
    among the rest (``candidates``; default every drafter), and every member's reward recorded each round."""

    kind = "tree"
    trees = True

    def __init__(
        self,
        arms: list[str],
        always: Annotated[list[str] | None, list_of(text(), null=True)] = None,
        size: Annotated[int, integer(1, note=" (drafters the bandit adds to each tree)")] = 1,
        candidates: list[str] | None = None,
        **kwargs,
    ):
        always, rest = _split(self.kind, list(arms), always if always is not None else [], candidates)
        super().__init__(arms, candidates=rest, **kwargs)
        self.always = tuple(always)
        self.size = _check_size(self.kind, size, rest)

    def playable(self) -> list[str]:
        return list(self.always) + list(self.candidates)

    @property
    def fixed_members(self) -> tuple[str, ...]:
        return self.always

    def update_tree(self, feedback: dict[str, Feedback]) -> None:
        self.t += 1
        for arm, fb in feedback.items():
            if arm in self._index:
                self._record(self._index[arm], self.reward_of(fb))


class TreeUCB(_TreeSubset, UCB):
    """``always`` + the ``size`` candidates of highest UCB index (unplayed first, ties: listed order);
    every member's own reward updates its statistics (full information over the tree)."""

    kind = "tree_ucb"

    def chosen(self) -> list[int]:
        return sorted(range(self.k), key=lambda i: (-self.index(i), i))[: self.size]

    def select(self) -> tuple[str, ...]:
        return self.always + tuple(self.candidates[i] for i in self.chosen())


class TreeHedge(_TreeSubset, Hedge):
    """``always`` + ``size`` candidates drawn without replacement from Hedge's weights; every member's own
    reward is its observed reward this round (unobserved candidates are charged their mean, as in Hedge)."""

    kind = "tree_hedge"

    def select(self) -> tuple[str, ...]:
        self._fold()
        probs = self.probabilities()
        picked: list[int] = []
        for _ in range(self.size):
            left = [p if i not in picked else 0.0 for i, p in enumerate(probs)]
            total = sum(left)
            picked.append(self._draw([p / total for p in left]))
        return self.always + tuple(self.candidates[i] for i in sorted(picked))


class Router(Selector):
    """The per-round router: ``Route(lookup, fallback, min_match)``. With ``fallback`` null a UCB over the
    other drafters (``ucb`` keys: beta, reward, seed) names the fallback each round and learns from the
    rounds it plays."""

    routes = True

    def __init__(
        self,
        arms: list[str],
        lookup: Annotated[str, text()] = "prompt_lookup",
        min_match: Annotated[int, integer(1, note=" (tokens of suffix match)")] = 2,
        fallback: Annotated[str | None, text(null=True)] = None,
        ucb: Annotated[
            dict | None, mapping(null=True, note=" (the fallback UCB's knobs)", keys=declared(UCB))
        ] = None,
        tree: Annotated[bool, boolean()] = False,
        min_expected: Annotated[
            float | None, number(0, null=True, note=" (expected accepted tokens of the retrieval draft)")
        ] = None,
    ):
        super().__init__(arms)
        self.tree = self.trees = bool(tree)
        self.lookup = _check_arms("router", [lookup], self.arms, "lookup")[0]
        self.min_match = min_match
        self.min_expected = None if min_expected is None else float(min_expected)
        self.inner: UCB | None = None
        if fallback is not None:
            self.fallback = _check_arms("router", [fallback], self.arms, "fallback")[0]
            self.others = [self.fallback]
        else:
            _, self.others = _split("router", self.arms, [self.lookup], None)
            self.inner = UCB(self.arms, candidates=self.others, **(ucb or {}))
            self.fallback = None

    def playable(self) -> list[str]:
        return [self.lookup] + [a for a in self.others if a != self.lookup]

    def reset(self, query=None) -> None:
        if self.inner is not None:
            self.inner.reset(query)

    def select(self) -> Route:
        then = self.fallback if self.inner is None else self.inner.select()
        return Route(
            self.lookup, (self.lookup, then) if self.tree else then, self.min_match, self.min_expected
        )

    def update(self, arm: str, feedback: Feedback) -> None:
        if self.inner is not None and arm in self.inner.candidates:
            self.inner.update(arm, feedback)

    def update_tree(self, feedback: dict[str, Feedback]) -> None:
        for arm, fb in feedback.items():
            self.update(arm, fb)
