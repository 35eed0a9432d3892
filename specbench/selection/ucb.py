"""UCB bandits: UCB1 (MetaSD's choice), and discounted / sliding-window UCB for non-stationary streams."""

from __future__ import annotations

import math
from collections import deque
from typing import Annotated

from specbench.selection.bandits import BanditSelector
from specbench.validate import COUNT, number


class UCB(BanditSelector):
    """UCB1 (Auer, Cesa-Bianchi & Fischer 2002) as in MetaSD: play each arm once, then
    ``argmax_i mean_i + beta * sqrt(2 ln t / n_i)`` with ``t = sum_i n_i`` (ties: first listed arm).
    ``beta`` scales exploration (1: UCB1). ``switch_cost``: the switching-cost variant, subtracted
    from the index of every arm but the one played last round (a switch costs the new drafter a
    KV-cache catch-up), so the selector switches only for a clear gain (0: plain UCB)."""

    def __init__(
        self,
        arms: list[str],
        beta: Annotated[float, number(0, note=" (1.0 is UCB1)")] = 1.0,
        switch_cost: Annotated[float, number(0, note=" (0: plain UCB)")] = 0.0,
        **kwargs,
    ):
        super().__init__(arms, **kwargs)
        self.beta = float(beta)
        self.switch_cost = float(switch_cost)
        self.last: int | None = None

    def index(self, i: int) -> float:
        """The UCB index of arm ``i`` (``inf`` before its first pull)."""
        if self.counts[i] <= 0:
            return math.inf
        log_t = math.log(max(sum(self.counts), 1.0))
        penalty = self.switch_cost if self.last is not None and i != self.last else 0.0
        return self.mean(i) + self.beta * math.sqrt(2.0 * log_t / self.counts[i]) - penalty

    def reset(self, query=None) -> None:
        super().reset(query)
        self.last = None

    def update(self, arm: str, feedback) -> None:
        super().update(arm, feedback)
        self.last = self._index[arm]

    def _choose(self) -> int:
        unplayed = self._unplayed()
        return unplayed[0] if unplayed else max(range(self.k), key=self.index)


class DiscountedUCB(UCB):
    """Discounted UCB (Garivier & Moulines 2011): before each update every statistic is multiplied
    by ``gamma``, so ``n_i = sum_s gamma^(t-s) 1[I_s = i]`` and ``S_i = sum_s gamma^(t-s) r_s 1[I_s = i]``;
    the index is UCB's with ``t = sum_i n_i`` (at most ``1 / (1 - gamma)``). The memory is short, so
    ``beta`` defaults to 0.5: with beta = 1 the bonus ``sqrt(2 ln t / n_i)``, n_i <= 1 / (1 - gamma),
    outweighs drafter gaps of ~0.3 and the choice degenerates to round robin."""

    def __init__(
        self,
        arms: list[str],
        gamma: Annotated[float, number(0, 1, low_open=True, note=" (the discount; 1 is UCB)")] = 0.95,
        beta: float = 0.5,
        **kwargs,
    ):
        super().__init__(arms, beta=beta, **kwargs)
        self.gamma = float(gamma)

    def _record(self, i: int, r: float) -> None:
        self._decay(self.gamma)
        super()._record(i, r)

    def _side(self, i: int, r: float) -> None:
        super()._record(i, r)  # same round as the pull it accompanies: no second discount


class SlidingWindowUCB(UCB):
    """Sliding-window UCB (Garivier & Moulines 2011): ``n_i`` and ``S_i`` count only the last
    ``window`` pulls, so ``t = min(pulls, window)``; an arm absent from the window is played next.
    With ``carry_over`` the window survives ``reset`` and its entries are weighted by ``decay``.
    ``beta`` defaults to 0.5 for the reason given in ``DiscountedUCB``."""

    def __init__(
        self, arms: list[str], window: Annotated[int, COUNT] = 32, beta: float = 0.5, **kwargs
    ):  # window: rounds
        super().__init__(arms, beta=beta, **kwargs)
        self.window = int(window)
        self._pulls: deque[tuple[int, float, float]] = deque(maxlen=self.window)  # (arm, weight, reward)

    def _refresh(self) -> None:
        self.counts, self.sums = [0.0] * self.k, [0.0] * self.k
        for i, w, r in self._pulls:
            self.counts[i] += w
            self.sums[i] += w * r

    def _clear(self) -> None:
        self._pulls.clear()
        self._refresh()

    def _decay(self, factor: float) -> None:
        self._pulls = deque(((i, factor * w, r) for i, w, r in self._pulls), maxlen=self.window)
        self._refresh()

    def _record(self, i: int, r: float) -> None:
        self._pulls.append((i, 1.0, r))
        self._refresh()
