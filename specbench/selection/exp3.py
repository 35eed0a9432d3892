"""EXP3: the adversarial-bandit baseline of MetaSD."""

from __future__ import annotations

import math
from typing import Annotated

from specbench.errors import SpecbenchError
from specbench.selection.bandits import BanditSelector
from specbench.validate import number


class EXP3(BanditSelector):
    """EXP3 (Auer, Cesa-Bianchi, Freund & Schapire 2002).

    ``p_i = (1 - gamma) w_i / sum_j w_j + gamma / K``; play ``I ~ p``; with reward ``x`` the
    importance-weighted estimate ``x_hat = x / p_I`` updates ``w_I <- w_I * exp(gamma * x_hat / K)``.
    Weights are kept as logarithms shifted so their max is 0 (no overflow); with ``carry_over``,
    ``reset`` maps ``w -> w ** decay`` (towards uniform). The usual tuning for a horizon of T rounds
    is ``gamma = min(1, sqrt(K ln K / ((e - 1) T)))``, about 0.2 for K = 3 and T = 50.
    """

    randomized = True

    def __init__(
        self,
        arms: list[str],
        gamma: Annotated[float, number(0, 1, low_open=True, note=" (the exploration share)")] = 0.2,
        **kwargs,
    ):
        super().__init__(arms, **kwargs)
        if self.full_information:
            # Its importance weights assume an arm's reward is seen only when the arm is drawn.
            raise SpecbenchError(
                "exp3 does not take full_information (side observations would bias its estimates)",
                "set full_information: false, or use ucb / discounted_ucb / sliding_window_ucb",
            )
        self.gamma = float(gamma)
        self.log_w = [0.0] * self.k

    def probabilities(self) -> list[float]:
        """The current distribution ``p`` over ``self.candidates`` (non-negative, sums to 1)."""
        w = [math.exp(lw) for lw in self.log_w]  # log_w <= 0 with max 0, so sum(w) >= 1
        total = sum(w)
        return [(1.0 - self.gamma) * wi / total + self.gamma / self.k for wi in w]

    def _choose(self) -> int:
        return self._draw(self.probabilities())

    def _record(self, i: int, r: float) -> None:
        p = self.probabilities()[i]  # weights have not moved since select(): the p the arm was drawn with
        super()._record(i, r)
        self.log_w[i] += self.gamma * (r / p) / self.k
        top = max(self.log_w)
        self.log_w = [lw - top for lw in self.log_w]

    def _clear(self) -> None:
        super()._clear()
        self.log_w = [0.0] * self.k

    def _decay(self, factor: float) -> None:
        super()._decay(factor)
        self.log_w = [factor * lw for lw in self.log_w]
