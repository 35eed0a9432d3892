"""Online drafter selection (MetaSD): a multi-armed bandit over the pool, one pull per speculative round.

The reward of a round is Block Divergence ``bd = (1/N_max) * sum_j (1 - TV(p_j, q_j))`` (dense, low
variance) or Block Efficiency ``be = accepted / N_max`` (sparse); both lie in [0, 1]. The
``autoregressive`` arm drafts nothing, so both rewards are 0 for it: it is left out unless asked for.
"""

from __future__ import annotations

import random
from typing import Annotated

from specbench.arms import AUTOREGRESSIVE
from specbench.errors import SpecbenchError
from specbench.selection.base import Feedback, Selector
from specbench.validate import SEED, boolean, list_of, number, text

REWARDS = ("bd", "be")


class BanditSelector(Selector):
    """State shared by the per-round bandits.

    Playable arms (``self.candidates``): ``candidates`` if given, else every pool arm except
    ``autoregressive`` (kept with ``include_autoregressive``). Statistics per playable arm i: pull
    count ``n_i`` and reward sum ``S_i`` (empirical mean ``S_i / n_i``) in ``self.counts`` /
    ``self.sums``. ``reset(query)`` zeroes them, or with ``carry_over`` multiplies them by ``decay``
    (warm start across queries: 1 keeps everything, 0 forgets). Randomness comes only from
    ``self.rng = random.Random(seed)``. Subclasses implement ``_choose() -> arm index``.

    ``full_information`` (reward ``bd`` only): early-exit arms that were not played still get their
    round's BD as a side observation (``observe``): it adds to ``n_i`` and ``S_i`` like a pull but
    does not advance the round counter ``t``.
    """

    def __init__(
        self,
        arms: list[str],
        reward: Annotated[str, text()] = "bd",  # bd | be
        candidates: Annotated[list[str] | None, list_of(text(), null=True)] = None,
        include_autoregressive: Annotated[bool, boolean()] = False,
        seed: Annotated[int, SEED] = 0,
        carry_over: Annotated[bool, boolean()] = False,
        decay: Annotated[float, number(0, 1)] = 1.0,
        full_information: Annotated[bool, boolean()] = False,
    ):
        super().__init__(arms)
        if reward not in REWARDS:
            raise SpecbenchError(
                f"unknown bandit reward '{reward}'",
                "use reward: bd (Block Divergence) or reward: be (Block Efficiency)",
            )
        if candidates is None:
            playable = [a for a in self.arms if include_autoregressive or a != AUTOREGRESSIVE]
        else:
            unknown = [str(a) for a in candidates if a not in self.arms]
            if unknown:
                raise SpecbenchError(
                    f"bandit selector: no arm named {', '.join(unknown)} in the pool",
                    f"use candidates from: {', '.join(self.arms)}",
                )
            playable = list(dict.fromkeys(candidates))
        if not playable:
            raise SpecbenchError(
                "bandit selector: no arm to play",
                "add a drafter to the pool, list candidates, or set include_autoregressive: true",
            )
        if full_information and reward != "bd":
            raise SpecbenchError(
                "full_information needs reward: bd (side observations are Block Divergences)",
                "set reward: bd, or full_information: false",
            )
        self.full_information = bool(full_information)
        self.reward = reward
        self.candidates = playable
        self.carry_over = bool(carry_over)
        self.decay = float(decay)
        self.rng = random.Random(seed)
        self._index = {a: i for i, a in enumerate(playable)}
        self.k = len(playable)
        self.counts = [0.0] * self.k
        self.sums = [0.0] * self.k
        self.t = 0  # rounds played in the current query

    # -- statistics ---------------------------------------------------------------------------
    def mean(self, i: int) -> float:
        """Empirical mean reward of arm ``i`` (0 before its first pull)."""
        return self.sums[i] / self.counts[i] if self.counts[i] > 0 else 0.0

    def _clear(self) -> None:
        self.counts = [0.0] * self.k
        self.sums = [0.0] * self.k

    def _decay(self, factor: float) -> None:
        self.counts = [factor * c for c in self.counts]
        self.sums = [factor * s for s in self.sums]

    def _record(self, i: int, r: float) -> None:
        self.counts[i] += 1.0
        self.sums[i] += r

    def _draw(self, probs: list[float]) -> int:
        """An index drawn from ``probs`` (a distribution over the arms) with the selector's own rng."""
        u, acc = self.rng.random(), 0.0
        for i, p in enumerate(probs):
            acc += p
            if u < acc:
                return i
        return self.k - 1  # u landed in the rounding slack of the last arm

    def _unplayed(self) -> list[int]:
        return [i for i in range(self.k) if self.counts[i] <= 0]

    def _greedy(self) -> int:
        """Index of the highest empirical mean (ties: the first listed arm)."""
        return max(range(self.k), key=self.mean)

    # -- the Selector interface ---------------------------------------------------------------
    def reset(self, query=None) -> None:
        if self.carry_over:
            self._decay(self.decay)
        else:
            self._clear()
        self.t = 0

    def select(self) -> str:
        return self.candidates[self._choose()]

    def _choose(self) -> int:
        raise NotImplementedError

    def reward_of(self, feedback: Feedback) -> float:
        """The configured reward of a round (``feedback.bd`` or ``feedback.be``), clipped to [0, 1]."""
        return min(1.0, max(0.0, float(getattr(feedback, self.reward))))

    def update(self, arm: str, feedback: Feedback) -> None:
        if arm not in self._index:
            raise ValueError(f"{type(self).__name__} got feedback for '{arm}', not one of {self.candidates}")
        self.t += 1
        self._record(self._index[arm], self.reward_of(feedback))

    def observe(self, arm: str, bd: float) -> None:
        if self.full_information and arm in self._index:
            self._side(self._index[arm], min(1.0, max(0.0, float(bd))))

    def _side(self, i: int, r: float) -> None:
        """Fold a side observation into arm ``i``'s statistics (by default exactly like a pull)."""
        self._record(i, r)


class RandomSelector(BanditSelector):
    """Uniform random arm each round, a static uniform mixture (the no-learning baseline); with
    ``per_query`` one uniform random arm per query, kept for all its rounds (a random single drafter)."""

    randomized = True

    def __init__(self, arms: list[str], per_query: Annotated[bool, boolean()] = False, **kwargs):
        super().__init__(arms, **kwargs)
        self.per_query = bool(per_query)
        self._arm: int | None = None

    def reset(self, query=None) -> None:
        super().reset(query)
        self._arm = None

    def _choose(self) -> int:
        if not self.per_query:
            return self.rng.randrange(self.k)
        if self._arm is None:
            self._arm = self.rng.randrange(self.k)
        return self._arm


class EpsilonGreedy(BanditSelector):
    """Each arm once, then with probability ``epsilon`` a uniform random arm, else argmax_i mean_i."""

    randomized = True

    def __init__(self, arms: list[str], epsilon: Annotated[float, number(0, 1)] = 0.1, **kwargs):
        super().__init__(arms, **kwargs)
        self.epsilon = float(epsilon)

    def _choose(self) -> int:
        unplayed = self._unplayed()
        if unplayed:
            return unplayed[0]
        if self.rng.random() < self.epsilon:
            return self.rng.randrange(self.k)
        return self._greedy()
