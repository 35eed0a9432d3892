"""Sequential Halving: fixed-budget best-arm identification at the start of each query, then commit."""

from __future__ import annotations

import math
from typing import Annotated

from specbench.selection.bandits import BanditSelector
from specbench.validate import integer


class SequentialHalving(BanditSelector):
    """Sequential Halving (Karnin, Koren & Somekh 2013) over a budget of ``budget`` rounds per query.

    With K arms there are ``L = ceil(log2 K)`` phases; in a phase with survivors ``S`` each is played
    ``max(1, floor(budget / (|S| L)))`` times, round robin, then the ``ceil(|S| / 2)`` with the best
    mean reward survive (means over all the arm's statistics: this query's pulls, plus the carried
    ones with ``carry_over``; ties keep the first listed arm). The last survivor plays the rest of
    the query. The schedule restarts at every ``reset``.
    """

    def __init__(self, arms: list[str], budget: Annotated[int, integer(1, note=" (rounds)")] = 24, **kwargs):
        super().__init__(arms, **kwargs)
        self.budget = int(budget)
        self.phases = math.ceil(math.log2(self.k)) if self.k > 1 else 0
        self._start_schedule()

    def _start_schedule(self) -> None:
        self.alive = list(range(self.k))
        self._queue: list[int] = []
        self._phase = 0

    def reset(self, query=None) -> None:
        super().reset(query)
        self._start_schedule()

    def _choose(self) -> int:
        if not self._queue and len(self.alive) > 1:
            if self._phase > 0:  # a phase just ended: keep the better half
                ranked = sorted(self.alive, key=self.mean, reverse=True)
                self.alive = sorted(ranked[: math.ceil(len(self.alive) / 2)])
            if len(self.alive) > 1:
                per_arm = max(1, self.budget // (len(self.alive) * self.phases))
                self._queue = [i for _ in range(per_arm) for i in self.alive]
                self._phase += 1
        return self._queue.pop(0) if self._queue else self.alive[0]
