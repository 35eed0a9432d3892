"""What a round costs, by context: the cost-model budget's verification and drafting seconds as functions of the
context length (the prompt and the committed tokens, which every forward attends to).

- **A profile over a grid of contexts** (``selector.costs: profile``: measured at start-up on contexts that span the
  run's, ``pipelines/cost_cache.py``; or given): at each grid context the verification seconds of ``n`` nodes
  ``a + b n`` and each drafter's seconds a round; between grid points linear in the context, beyond the last the
  last segment's slope (attention grows with the cache), below the first the first point's value.
- **Without a profile**: verification ``a + b n`` fitted online over the rounds played (``VerifyCost``) and each
  drafter's running mean a round: no context axis of their own.
- **Corrected online, by context**: per context bin (powers of two) the verification line ``a + b n`` is refitted by
  least squares over the bin's rounds beside two pseudo-rounds on the base line (``BinLines``), interpolated between
  bin centres; a drafter's seconds are scaled per bin by the geometric mean of measured over predicted (``Correction``).
  A profile measured at contexts the run never reaches, or one whose grid misses where the run spends its rounds, is
  corrected by the rounds themselves; without a profile these corrections are the only context axis.

Given costs (``costs: {verify: ..., draft: ...}``) are never corrected: every decision is then independent of the
clock (reproducible; the seeded tests).
"""

from __future__ import annotations

import bisect
import math

MIN_FIT = 8  # rounds before the online verification cost's slope is fitted
ANCHOR = 8  # rounds a context bin needs before its own line anchors the curve (before: its neighbours' lines)
CLIP = 3.0  # a round's log ratio is clipped to +-3 (a stall of the machine moves one bin, not the run)


class VerifyCost:
    """Seconds of a verification forward over ``n`` nodes: ``a + b n`` fitted online (prior slope ``node_cost * a``)."""

    def __init__(self, node_cost: float):
        self.node_cost = node_cost
        self.s = [0.0] * 5  # count, sum n, sum n^2, sum t, sum n t

    def observe(self, n: int, t: float) -> None:
        for i, v in enumerate((1.0, n, n * n, t, n * t)):
            self.s[i] += v

    def coefficients(self) -> tuple[float, float]:
        c, sn, snn, st, snt = self.s
        if c == 0:
            return 0.03, 0.03 * self.node_cost  # before any round: a nominal step (only ratios matter)
        var = snn / c - (sn / c) ** 2
        if c >= MIN_FIT and var > 1.0:
            b = max((snt / c - (sn / c) * (st / c)) / var, 0.0)
            return max(st / c - b * sn / c, 1e-6), b
        a = (st / c) / (1.0 + self.node_cost * sn / c)
        return a, self.node_cost * a


class Curve:
    """A value by context, piecewise linear over a grid (``contexts`` ascending): flat below the first point, the
    last segment's slope beyond the last (never below the last point's value)."""

    def __init__(self, contexts: list[float], values: list[float]):
        if not contexts or len(contexts) != len(values):
            raise ValueError(f"a curve needs as many values as contexts (got {contexts}, {values})")
        order = sorted(range(len(contexts)), key=lambda i: contexts[i])
        self.x = [float(contexts[i]) for i in order]
        self.y = [float(values[i]) for i in order]

    def __call__(self, context: float) -> float:
        x, y = self.x, self.y
        if len(x) == 1 or context <= x[0]:
            return y[0]
        j = min(bisect.bisect_right(x, context), len(x) - 1)
        i = j - 1
        slope = (y[j] - y[i]) / (x[j] - x[i]) if x[j] > x[i] else 0.0
        value = y[i] + slope * (context - x[i])
        return max(value, y[-1]) if context > x[-1] else value


def context_bin(context: float) -> int:
    """The correction's bin of a context length: 0 below 128 tokens, then one per doubling (128-255: 1, ...)."""
    return max(0, int(math.log2(max(context, 1.0) / 64.0)))


class Correction:
    """Measured over predicted seconds by context bin: a geometric mean per bin, shrunk to the run-wide one by
    ``prior`` pseudo-rounds (the run-wide one to 1 likewise)."""

    def __init__(self, prior: float = 1.0):
        self.prior = prior
        self.bins: dict[int, list[float]] = {}  # bin -> [rounds, sum of log ratios]
        self.total = [0.0, 0.0]

    def observe(self, context: float, predicted: float, measured: float) -> None:
        if predicted <= 0 or measured <= 0 or not math.isfinite(measured):
            return
        r = max(-CLIP, min(CLIP, math.log(measured / predicted)))
        cell = self.bins.setdefault(context_bin(context), [0.0, 0.0])
        for acc in (cell, self.total):
            acc[0] += 1.0
            acc[1] += r

    def log_factor(self, context: float) -> float:
        overall = self.total[1] / (self.total[0] + self.prior)
        n, s = self.bins.get(context_bin(context), (0.0, 0.0))
        return (s + self.prior * overall) / (n + self.prior)

    def __call__(self, context: float) -> float:
        return math.exp(self.log_factor(context))


class BinLines:
    """Verification seconds ``a + b n`` per context bin, each fitted by least squares over the bin's rounds together
    with ``prior`` pseudo-rounds on the base line (at 0 and 16 nodes), so a bin with few rounds keeps the base and one
    with many follows its rounds. Each bin's line (once it has ``ANCHOR`` rounds) stands at the mean context of them;
    between two such points the coefficients are interpolated linearly in the context, beyond them extrapolated through
    the two nearest; with one bin of rounds, its line is moved as the base moves."""

    def __init__(self, prior: float = 2.0):
        self.prior = prior
        self.sums: dict[int, list[float]] = {}  # bin -> count, sum n, sum n^2, sum t, sum n t, sum context

    def observe(self, n: int, context: float, t: float) -> None:
        acc = self.sums.setdefault(context_bin(context), [0.0] * 6)
        for i, v in enumerate((1.0, n, n * n, t, n * t, context)):
            acc[i] += v

    def _at(self, b: int) -> float:
        return self.sums[b][5] / self.sums[b][0]

    def _line(self, b: int, base) -> tuple[float, float]:
        """Bin ``b``'s fitted line at its rounds' mean context (``base``: the base line's ``(a, b)`` by context)."""
        x = self._at(b)
        a0, b0 = base(x)
        c, sn, snn, st, snt, _ = self.sums[b]
        w = self.prior / 2.0
        for n in (0.0, 16.0):  # the pseudo-rounds on the base line
            t = a0 + b0 * n
            c, sn, snn, st, snt = c + w, sn + w * n, snn + w * n * n, st + w * t, snt + w * n * t
        var = snn / c - (sn / c) ** 2
        slope = max((snt / c - (sn / c) * (st / c)) / var, 0.0) if var > 1e-9 else b0
        return max(st / c - slope * sn / c, 1e-6), slope

    def __call__(self, context: float, base) -> tuple[float, float]:
        """``(a, b)`` at ``context``; ``base(context)``: the base line's ``(a, b)`` there."""
        if not self.sums:
            return base(context)
        anchors = [b for b, acc in self.sums.items() if acc[0] >= ANCHOR] or list(self.sums)
        points = sorted((self._at(b), b) for b in anchors)
        below = [p for p in points if p[0] <= context]
        above = [p for p in points if p[0] > context]
        if below and above:
            (x0, b0), (x1, b1) = below[-1], above[0]
            l0, l1 = self._line(b0, base), self._line(b1, base)
            f = (context - x0) / (x1 - x0)
            return l0[0] + f * (l1[0] - l0[0]), l0[1] + f * (l1[1] - l0[1])
        if len(points) >= 2:  # beyond the outermost bins with rounds: the line through the two nearest
            (x0, b0), (x1, b1) = points[-2:] if below else points[:2]
            l0, l1 = self._line(b0, base), self._line(b1, base)
            f = (context - x0) / (x1 - x0)
            return max(l0[0] + f * (l1[0] - l0[0]), 1e-6), max(l0[1] + f * (l1[1] - l0[1]), 0.0)
        x, b = points[0]
        line, at, here = self._line(b, base), base(x), base(context)
        return max(line[0] + here[0] - at[0], 1e-6), max(line[1] + here[1] - at[1], 0.0)


class ContextCosts:
    """Verification and drafting seconds of a round at a context (see the module's docstring). ``profile``:
    ``{contexts: [...], verify: [[a, b], ...], draft: {drafter: [seconds, ...]}}`` (one entry per context; a drafter's
    seconds may be one number for every context), or None to measure online. ``correct``: learn from the rounds
    (False for given costs)."""

    def __init__(
        self, drafters: list[str], node_cost: float, profile: dict | None = None, correct: bool = True
    ):
        self.drafters = list(drafters)
        self.correct = correct
        self.fitted = VerifyCost(node_cost)
        self.a: Curve | None = None
        self.b: Curve | None = None
        self.base_draft: dict[str, Curve] = {}
        if profile is not None:
            contexts = [float(c) for c in profile["contexts"]]
            self.a = Curve(contexts, [float(v[0]) for v in profile["verify"]])
            self.b = Curve(contexts, [float(v[1]) for v in profile["verify"]])
            for name, seconds in (profile.get("draft") or {}).items():
                values = [float(seconds)] * len(contexts) if isinstance(seconds, int | float) else seconds
                self.base_draft[name] = Curve(contexts, [float(v) for v in values])
        self.running: dict[str, float | None] = {name: None for name in self.drafters}  # without a profile
        self.lines = BinLines(
            2.0 if profile is not None else 0.5
        )  # a base without a context axis: a weaker prior
        self.draft_correction = {name: Correction() for name in self.drafters}

    @property
    def profiled(self) -> bool:
        return self.a is not None

    def _base(self, context: float) -> tuple[float, float]:
        return (self.a(context), self.b(context)) if self.a is not None else self.fitted.coefficients()

    def coefficients(self, context: float) -> tuple[float, float]:
        """``(a, b)`` of the verification seconds ``a + b n`` at ``context``, as the rounds corrected them."""
        return self.lines(context, self._base) if self.correct else self._base(context)

    def verify(self, n: int, context: float) -> float:
        a, b = self.coefficients(context)
        return a + b * n

    def draft(self, name: str, context: float) -> float | None:
        """Drafter ``name``'s seconds a round at ``context``; None before it ever drafted (no profile names it)."""
        base = self.base_draft[name](context) if name in self.base_draft else self.running.get(name)
        if base is None:
            return None
        return base * (self.draft_correction[name](context) if self.correct else 1.0)

    def observe_verify(self, n: int, context: float, seconds: float) -> None:
        """A round's measured verification seconds over ``n`` nodes at ``context``."""
        if not self.correct or not (seconds > 0 and math.isfinite(seconds)):
            return
        if self.a is None:
            self.fitted.observe(n, seconds)
        self.lines.observe(n, context, seconds)

    def observe_draft(self, name: str, context: float, seconds: float) -> None:
        if not self.correct or name not in self.draft_correction:
            return
        if name not in self.base_draft:
            old = self.running[name]
            self.running[name] = seconds if old is None else 0.9 * old + 0.1 * seconds
        base = self.base_draft[name](context) if name in self.base_draft else self.running[name]
        self.draft_correction[name].observe(context, base, seconds)


def profile_of(costs: dict, drafters: list[str]) -> dict:
    """Given or profiled costs as a profile over contexts: ``{verify: [a, b], draft: {drafter: seconds}}`` (one context,
    the form before contexts) becomes a one-point grid; ``{contexts, verify: [[a, b], ...], draft}`` is kept."""
    if "contexts" in costs:
        return {
            "contexts": list(costs["contexts"]),
            "verify": costs["verify"],
            "draft": dict(costs.get("draft") or {}),
        }
    draft = {d: 0.0 for d in drafters} | dict(costs.get("draft") or {})
    return {"contexts": [0.0], "verify": [list(costs["verify"])], "draft": draft}
