"""Explore-then-commit: for pools where switching drafters costs a KV-cache catch-up prefill."""

from __future__ import annotations

import math
from typing import Annotated

from specbench.selection.bandits import BanditSelector
from specbench.validate import integer, number


class ExploreThenCommit(BanditSelector):
    """Play the arms round robin until each has ``m`` pulls, then commit to ``argmax_i mean_i`` for
    the rest of the query (ties: the first listed arm).

    With ``delta`` (a failure probability; ``null`` turns it off) an arm is eliminated early once
    ``mean_i + r_i < max_j (mean_j - r_j)`` with ``r_i = sqrt(ln(2 K m / delta) / (2 n_i))``
    (Hoeffding plus a union bound over K arms and m pulls each); exploration ends as soon as one arm
    is left. Counts include carried statistics with ``carry_over``, so a warm start can commit at once.
    """

    def __init__(
        self,
        arms: list[str],
        m: Annotated[int, integer(1, note=" (exploration pulls per arm)")] = 3,
        delta: Annotated[
            float | None, number(0, 1, null=True, low_open=True, note=" (null: no elimination)")
        ] = 0.1,
        **kwargs,
    ):
        super().__init__(arms, **kwargs)
        self.m = int(m)
        self.delta = delta
        self._start()

    def _start(self) -> None:
        self.alive = list(range(self.k))
        self.committed: int | None = None

    def reset(self, query=None) -> None:
        super().reset(query)
        self._start()

    def _radius(self, i: int) -> float:
        return math.sqrt(math.log(2 * self.k * self.m / self.delta) / (2 * self.counts[i]))

    def _eliminate(self) -> None:
        pulled = [i for i in self.alive if self.counts[i] > 0]
        if len(pulled) < 2:
            return
        best_lower = max(self.mean(i) - self._radius(i) for i in pulled)
        self.alive = [
            i for i in self.alive if self.counts[i] <= 0 or self.mean(i) + self._radius(i) >= best_lower
        ]

    def _choose(self) -> int:
        if self.committed is None:
            if self.delta is not None:
                self._eliminate()
            todo = [i for i in self.alive if self.counts[i] < self.m]
            if len(self.alive) > 1 and todo:
                return min(todo, key=lambda i: self.counts[i])
            self.committed = max(self.alive, key=self.mean)
        return self.committed
