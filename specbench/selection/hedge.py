"""Hedge: exponential weights on full-information losses (HedgeSpec's "not a bandit" setting)."""

from __future__ import annotations

import math
from typing import Annotated

from specbench.selection.bandits import BanditSelector
from specbench.validate import number


class Hedge(BanditSelector):
    """Hedge (Freund & Schapire 1997) over the playable arms, one round per speculative round.

    Each round every arm ``i`` suffers a loss ``1 - r_i`` in [0, 1]: ``r_i`` is its reward when it was
    observed this round (played, or a side observation under ``full_information``), otherwise its
    mean observed reward so far (``0.5`` before its first observation): an arm that cannot be observed
    unplayed is charged what it is expected to score, neither favoured nor punished for being unseen.
    Arms are drawn from ``p_i = exp(-eta L_i) / sum_j exp(-eta L_j)`` on the cumulative losses ``L``.
    With every arm observed every round this is Hedge exactly; the usual tuning for T rounds and K
    arms is ``eta = sqrt(8 ln K / T)`` (about 0.4 for K = 3, T = 50). ``reset`` zeroes ``L`` (with
    ``carry_over``: multiplies it by ``decay``).
    """

    randomized = True

    def __init__(
        self,
        arms: list[str],
        eta: Annotated[float, number(0, low_open=True, note=" (Hedge's learning rate, e.g. 0.5)")] = 0.5,
        **kwargs,
    ):
        super().__init__(arms, **kwargs)
        self.eta = float(eta)
        self.losses = [0.0] * self.k
        self._seen: dict[int, float] = {}  # this round's observed rewards, folded in at the next select

    def probabilities(self) -> list[float]:
        low = min(self.losses)
        w = [math.exp(-self.eta * (loss - low)) for loss in self.losses]  # shifted: the best weight is 1
        total = sum(w)
        return [wi / total for wi in w]

    def _fold(self) -> None:
        """Charge every arm its loss for the round just played (no-op before the first round)."""
        if not self._seen:
            return
        for i in range(self.k):
            r = self._seen[i] if i in self._seen else (self.mean(i) if self.counts[i] > 0 else 0.5)
            self.losses[i] += 1.0 - r
        self._seen = {}

    def _choose(self) -> int:
        self._fold()
        return self._draw(self.probabilities())

    def _record(self, i: int, r: float) -> None:
        super()._record(i, r)
        self._seen[i] = r

    def reset(self, query=None) -> None:
        self._fold()
        super().reset(query)

    def _clear(self) -> None:
        super()._clear()
        self.losses = [0.0] * self.k
        self._seen = {}

    def _decay(self, factor: float) -> None:
        super()._decay(factor)
        self.losses = [factor * loss for loss in self.losses]
