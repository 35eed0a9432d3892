"""The batch budget (issue 57, item 4; beside the loop since issue 68): how many draft tokens a batched round verifies,
chosen for the whole batch (``engine.py`` cuts every row's chain to it; ``goodput:<drafter>`` methods play it).

A batched round scores every row's ``[last committed token, *draft]`` in one target forward, padded to the longest
row, so the forward's cost depends on the rows and on the longest input, ``q`` (``ForwardCosts``, measured at start-up
by ``pipelines/batch_costs.py``). At batch 1 a few more tokens are nearly free; at batch 32 every row's extra token
is paid for. So each round the budget cuts every row's draft to a common cap ``L`` (0 to the longest draft): the
``L`` of the most expected tokens per predicted second over the batch,

    goodput(L) = (rows + sum over rows of E_r(L)) / seconds(rows, 1 + L),

``E_r(L)`` the expected accepted tokens of row ``r``'s draft cut to ``L`` tokens (a cut draft is verified exactly as
a short draft: lossless). ``L = 0`` is plain batched greedy decoding: the budget stops drafting where the cost curve
says drafting cannot pay. Cutting only some rows saves nothing (the forward is padded to the longest row anyway),
so one cap per round is the whole decision.

``E_r(L)`` is the sum over the first ``L`` positions of the chance the target accepts the path to it: the product of
its tokens' acceptance estimates, each from ``selection.budget.Calibration`` (a Beta posterior per drafter and
bin of the drafter's own local score, or per depth for drafters that give none), updated with every verified
token whose parent was accepted. The statistics are the run's own and carry across batches.

Pure: no clock, no model. The round records its expected tokens and predicted seconds (``Round.expected``,
``Round.predicted_s``) beside the measured ones.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from specbench.decoding.drafter import Draft, keep_tokens
from specbench.errors import SpecbenchError
from specbench.selection.budget import BINS, Calibration


@dataclass(frozen=True)
class ForwardCosts:
    """Seconds of one batched forward over ``rows`` rows of ``q`` new tokens each: ``seconds[i][j]`` measured at
    ``rows_grid[i]``, ``q_grid[j]``; between grid points linear in each (bilinear), beyond the grid extended by
    the last segment's slope, and never decreasing in ``q`` or in rows (a measurement's noise does not make a
    longer forward cheaper)."""

    rows_grid: tuple[int, ...]
    q_grid: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]

    def __post_init__(self):
        shape = (len(self.rows_grid), len(self.q_grid))
        if (
            not all(shape)
            or len(self.seconds) != shape[0]
            or any(len(r) != shape[1] for r in self.seconds)
            or list(self.rows_grid) != sorted(set(self.rows_grid))
            or list(self.q_grid) != sorted(set(self.q_grid))
            or min(self.rows_grid) < 1
            or min(self.q_grid) < 1
            or any(not t > 0 for r in self.seconds for t in r)
        ):
            raise SpecbenchError(
                f"batch forward costs: a {shape[0]} x {shape[1]} grid of positive seconds over increasing rows "
                f"{list(self.rows_grid)} and q {list(self.q_grid)} was expected, got {self.seconds!r}",
                "delete the cached profile (it is measured again at start-up)",
            )

        # each row of the grid made non-decreasing in q once, not at every call (the budget asks every round)
        object.__setattr__(self, "_by_q", tuple(_monotone(r) for r in self.seconds))

    def __call__(self, rows: int, q: int) -> float:
        by_rows = [_line(self.q_grid, r, q) for r in self._by_q]
        return max(_line(self.rows_grid, _monotone(by_rows), rows), 1e-9)

    def as_dict(self) -> dict:
        return {
            "rows": list(self.rows_grid),
            "q": list(self.q_grid),
            "seconds": [list(r) for r in self.seconds],
        }

    @classmethod
    def from_dict(cls, data: dict) -> ForwardCosts:
        try:
            return cls(
                tuple(int(x) for x in data["rows"]),
                tuple(int(x) for x in data["q"]),
                tuple(tuple(float(t) for t in r) for r in data["seconds"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecbenchError(
                f"batch forward costs {data!r} are not {{rows: [...], q: [...], seconds: [[...]]}} ({exc})",
                "delete the cached profile (it is measured again at start-up)",
            ) from None


def _monotone(values: Sequence[float]) -> list[float]:
    out, best = [], 0.0
    for v in values:
        best = max(best, v)
        out.append(best)
    return out


def _line(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear ``y(x)`` through the points; beyond them, the nearest segment extended."""
    if len(xs) == 1:
        return ys[0] * (x / xs[0] if x > xs[0] else 1.0)  # one point: proportional above it
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def first_path(draft: Draft) -> Draft:
    """A tree draft's first path (each token the first child of the one before); a chain as it is: what the budget
    plans, one chain a row."""
    if draft.parents is None:
        return draft
    path, last = [], -1
    for i, parent in enumerate(draft.parents):
        if parent == last:
            path.append(i)
            last = i
    return replace(keep_tokens(draft, path), parents=None)  # one path: a chain


def path_chances(estimates: Sequence[float]) -> list[float]:
    """Per position of a chain, the chance every token up to it is accepted (running products)."""
    out, p = [], 1.0
    for e in estimates:
        p *= e
        out.append(p)
    return out


def best_cap(chances: Sequence[Sequence[float]], seconds: Callable[[int], float]) -> tuple[int, float, float]:
    """``(L, expected accepted tokens of the batch, predicted seconds)`` for the cap ``L`` (0 to the longest draft)
    of the most expected tokens per second, ``(rows + sum_r sum_{i<L} chances[r][i]) / seconds(1 + L)``; the
    smaller ``L`` on a tie."""
    rows = len(chances)
    longest = max((len(c) for c in chances), default=0)
    best = (0, 0.0, seconds(1))
    rate = rows / best[2]
    for cap in range(1, longest + 1):
        expected = sum(sum(c[:cap]) for c in chances)
        t = seconds(1 + cap)
        if (rows + expected) / t > rate * (1 + 1e-12):
            best, rate = (cap, expected, t), (rows + expected) / t
    return best


def _locals(draft: Draft) -> list[float | None]:
    """Each chain token's local score (its path score over its parent's), or None without scores."""
    if draft.scores is None:
        return [None] * len(draft.tokens)
    out, before = [], 1.0
    for s in draft.scores[: len(draft.tokens)]:
        out.append(s / before if before > 0 else 0.0)
        before = s
    return out


class BatchBudget:
    """The cap of each batched round (the module's docstring): ``plan`` before the forward, ``observe`` after."""

    def __init__(self, costs: ForwardCosts, prior: float = 2.0):
        self.costs = costs
        self.prior = prior
        self.calibration: dict[str, Calibration] = {}

    def chances(self, name: str, draft: Draft) -> list[float]:
        cal = self.calibration.setdefault(name, Calibration(self.prior))
        return path_chances([cal.estimate(cal.key(s, d)) for d, s in enumerate(_locals(draft), 1)])

    def ceiling(self, name: str, k: int, scored: bool) -> list[float]:
        """Per position of a ``k``-token draft not yet made, the largest chance ``chances`` could give it: each
        token's estimate bounded by the largest its key could have (the depth bin, and every score bin for a
        drafter whose drafts carry scores)."""
        cal = self.calibration.setdefault(name, Calibration(self.prior))
        scores = [("score", b) for b in range(BINS)] if scored else []
        return path_chances(
            [max(cal.estimate(key) for key in [cal.key(None, d), *scores]) for d in range(1, k + 1)]
        )

    def may_draft(self, rows: Sequence[tuple[str, int, bool]]) -> bool:
        """Whether any cap could pay this round, asked before any row drafts: ``rows`` holds each row's drafter
        name, the tokens it will be asked for and whether its drafts carry scores. Every draft's chances lie
        at or below its ``ceiling`` position by position, and the cap's seconds do not depend on them, so when no
        cap beats 0 under the ceilings, ``plan`` chooses 0 under the drafts themselves: not drafting this round
        changes no decision."""
        made: dict[tuple, list[float]] = {}  # rows of one drafter and draft length share a ceiling
        for row in map(tuple, rows):
            if row not in made:
                made[row] = self.ceiling(*row)
        ceilings = [made[tuple(row)] for row in rows]
        return best_cap(ceilings, lambda q: self.costs(len(rows), q))[0] > 0

    def plan(self, drafts: Sequence[tuple[str, Draft]]) -> tuple[int, list[float], float]:
        """``(cap, each row's expected accepted tokens under it, predicted seconds of the forward)``: ``drafts``
        holds each row's drafter name and chain draft, in the batch's row order."""
        chances = [self.chances(name, d) for name, d in drafts]
        cap, _, t = best_cap(chances, lambda q: self.costs(len(drafts), q))
        return cap, [sum(c[:cap]) for c in chances], t

    def observe(self, name: str, draft: Draft, accepted: int) -> None:
        """A verified chain draft: its first ``accepted`` tokens accepted; the one after (if drafted) rejected;
        tokens beyond it were not judged (their parent was rejected)."""
        cal = self.calibration.setdefault(name, Calibration(self.prior))
        for d, s in enumerate(_locals(draft)[: accepted + 1], 1):
            cal.observe(cal.key(s, d), d <= accepted)


__all__ = ["BatchBudget", "ForwardCosts", "best_cap", "first_path", "path_chances"]
