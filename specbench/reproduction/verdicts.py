"""Pattern verdicts: each checks one claim of a paper on per-query PAIRED data, with a confidence interval.

Every comparison of speeds or qualities is judged on the queries both sides ran (paired by query id), with an
interval over queries at a stated level (``LEVEL``: 95%, two-sided) made by ``INTERVAL``: the jackknife t interval,
chosen by its A/A false-hold rate at small n (``make aa-cpu``), or a seeded bootstrap (``RESAMPLES`` resamples,
``numpy.random.default_rng(SEED)``) read as a percentile, expanded or BCa interval. A claim "effect > x" (x: the
null, e.g. a speedup ratio of 1, or a threshold such as 0.95 of the oracle) is

- ``held`` only when the whole interval lies above x (strictly: a tie is never held; no tolerance turns
  ``>`` into ``>=``);
- ``not held`` when the interval excludes the claim (it lies at or below x; for an "at least x" claim,
  entirely below x);
- ``inconclusive`` when the interval straddles x at an adequate n (the data cannot tell);
- ``not judged (n < 16)`` when fewer than ``MIN_N`` paired queries exist (16: what a speed claim on one task
  cell needs here), and ``not judged`` when the data have no per-query form (``unpaired``) or are missing
  (``missing``).

Each judged verdict also carries a p-value for its claim (``p``: the level at which the interval's bound reaches x,
so ``p < 1 - LEVEL`` exactly when the interval excludes x on the claim's side): read on Student's t law for the t
interval, from the share of resampled effects on the null's side of x for a bootstrap interval; there, where fewer
than ``TAIL`` of the interval's resamples fall on that side, more are drawn (``adaptive_p``, up to
``MAX_RESAMPLES``), so a p-value resolves far below the 2 / 2000 floor of the interval's own resamples. A report
judges many claims at once, so :func:`holm` applies Holm's step-down correction across all of them: a verdict
held at its own level stays held only if its p-value passes Holm's threshold at the family-wise level
``1 - LEVEL``; one that does not becomes ``inconclusive`` and says so.

Each line shows n, the effect and its interval (e.g. ``**held**: ... (n=16, speedup ratio 1.210, 95% CI
[1.080, 1.350]; ...)``, ``**not judged**: ... (n < 16; n=3, ...)``); a claim made of several comparisons
(``all_of``, ``any_of``) shows the deciding one and lists every part.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

LEVEL = 0.95  # two-sided confidence level of every interval
RESAMPLES = 2000  # bootstrap resamples of the queries (the interval)
# p-values resample further where few resamples fall on the null's side (``adaptive_p``): up to this many, so a
# p-value resolves down to 2 / MAX_RESAMPLES = 1e-5, below Holm's first threshold over up to 5,000 claims
MAX_RESAMPLES = 200_000
# resamples on the null's side that make a p-value resolved (its relative error about 1 / sqrt(TAIL))
TAIL = 20
CHUNK = 20_000  # resamples drawn at once (memory: CHUNK x n indices)
SEED = 0  # numpy Generator seed: the same data give the same interval
MIN_N = 16  # fewer paired queries than this: not judged (a speed claim's task cell holds 16 queries)
# how the resamples become an interval: the plain percentile interval, Hesterberg's expanded percentile interval (the
# percentile interval at the level whose normal quantile is sqrt(n / (n - 1)) times Student's t quantile on n - 1
# degrees of freedom: it undoes the bootstrap's narrowness at small n) or Efron's BCa (bias-corrected and
# accelerated, the acceleration from the jackknife). Or no resampling at all: the jackknife t interval, the point
# estimate plus or minus Student's t quantile (n - 1 degrees of freedom) times the jackknife's standard error, its
# p-value read on the same t law (exact to the integration's precision, so it has no resampling floor). The default
# is the narrowest whose pooled A/A false-hold rate stays at most the nominal (1 - LEVEL) / 2 at n = 16, 32 and 80
# (``make aa-cpu``: docs/aa-cpu.md): the t interval (2.3%, 2.1%, 2.4%; expanded 3.2%, 2.7%, 3.1%).
INTERVALS = ("percentile", "expanded", "bca", "t")
INTERVAL = "t"
INTERVAL_NAMES = {
    "percentile": "percentile",
    "expanded": "expanded percentile (Hesterberg)",
    "bca": "BCa",
    "t": "jackknife t",
}
INTERVAL_TEXT = f"{INTERVAL_NAMES[INTERVAL]} interval"  # how pages name the verdicts' interval

N_SMALL = f"n < {MIN_N}"
INCONCLUSIVE = "inconclusive"  # the interval straddles the claim's threshold at an adequate n
NOT_ESTIMABLE = "effect not estimable"
NO_PAIRS = "no per-query data"
UNSTABLE = (
    "unstable"  # its mark differs between two runs of the same plan (``stability``): never counted held
)
MARKS = ("held", "not held", "inconclusive", "not judged", "unstable")


@dataclass(frozen=True)
class Verdict:
    claim: str
    held: bool | None
    detail: str
    unfinished: str = ""  # why a verdict on an unfinished run is not judged (empty: the run finished)
    n: int | None = None  # paired queries the interval rests on
    effect: float | None = None  # the point estimate on every paired query
    interval: tuple[float, float] | None = None  # its bootstrap interval at ``level``
    label: str = ""  # what the effect is ("speedup ratio", "MAT ratio", ...)
    level: float = LEVEL
    reason: str = ""  # why it is not judged (n too small, no per-query data, missing, unfinished)
    # the null the interval is set against (1 for "faster", 0.95 for "0.95 of")
    threshold: float | None = None
    p: float | None = None  # bootstrap p-value of the claim (two-sided equivalent; None: not tested)

    def __post_init__(self):  # numpy booleans / numbers from table arithmetic become plain ones
        if self.held is not None:
            object.__setattr__(self, "held", bool(self.held))
        if self.effect is not None:
            object.__setattr__(self, "effect", float(self.effect))
        if self.interval is not None:
            object.__setattr__(self, "interval", (float(self.interval[0]), float(self.interval[1])))

    @property
    def mark(self) -> str:
        if self.held is None and self.reason in (INCONCLUSIVE, UNSTABLE):
            return self.reason
        return {True: "held", False: "not held", None: "not judged"}[self.held]

    @property
    def stats(self) -> str:
        """``n=16, speedup ratio 1.210, 95% CI [1.080, 1.350]`` (n=0 and no estimate when nothing pairs)."""
        n = self.n or 0
        if self.effect is None or not _ok(self.effect):
            return f"n={n}, {self.label or 'effect'} not estimated"
        out = f"n={n}, {self.label or 'effect'} {self.effect:.3f}"
        if self.interval is not None:
            out += f", {self.level * 100:.4g}% CI [{self.interval[0]:.3f}, {self.interval[1]:.3f}]"
        return out

    def line(self) -> str:
        """``**mark**: claim (why not judged; n, effect, interval; detail)``: the mark is always followed by
        ``: `` (the report's index and tests find verdict lines by ``- **held|not held|inconclusive|not judged|unstable**: ``)."""
        why = (
            f"{self.reason}; "
            if self.held is None and self.reason and self.reason not in (INCONCLUSIVE, UNSTABLE)
            else ""
        )
        detail = f"; {self.detail}" if self.detail else ""
        return f"**{self.mark}**: {self.claim} ({why}{self.stats}{detail})"


def _ok(*values) -> bool:
    return all(v is not None and not (isinstance(v, float) and math.isnan(v)) for v in values)


def unfinished(verdict: Verdict, why: str) -> Verdict:
    """``verdict`` not judged: the run it reads stopped before it finished (``why``), so its numbers are partial."""
    return Verdict(
        verdict.claim,
        None,
        f"{why}; on the finished part: {verdict.mark}" + (f"; {verdict.detail}" if verdict.detail else ""),
        unfinished=why,
        n=verdict.n,
        effect=verdict.effect,
        interval=verdict.interval,
        label=verdict.label,
        level=verdict.level,
        reason="unfinished run",
        threshold=verdict.threshold,
    )  # no p: not part of the tested family


def missing(claim: str, what: str, label: str = "") -> Verdict:
    return Verdict(claim, None, f"missing: {what}", label=label, n=0, reason="missing data")


def unpaired(claim: str, why: str, label: str = "") -> Verdict:
    """A claim whose data have no per-query form (an aggregate table): kept, never judged; ``why`` says why."""
    return Verdict(claim, None, why, label=label, n=0, reason=NO_PAIRS)


@dataclass(frozen=True)
class Bootstrap:
    """How a claim is judged: its interval's two-sided ``level``, the ``resamples`` of the queries and their
    ``seed``, and the fewest paired queries it is judged on (``min_n``)."""

    level: float = LEVEL
    resamples: int = RESAMPLES
    seed: int = SEED
    min_n: int = MIN_N
    max_resamples: int = MAX_RESAMPLES  # p-values only (``adaptive_p``)
    interval: str = INTERVAL  # how the resamples become an interval (``INTERVALS``)

    def __post_init__(self):
        if self.interval not in INTERVALS:
            raise ValueError(f"unknown interval method {self.interval!r}: use one of {', '.join(INTERVALS)}")


DEFAULT = Bootstrap()


# ---------------------------------------------------------------- the bootstrap core
Stat = Callable[[Mapping[str, np.ndarray]], np.ndarray]


def resample(
    columns: Mapping[str, Sequence[float]], stat: Stat, resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, np.ndarray]:
    """(``stat`` on every query, its finite values over ``resamples`` resamples of the queries with replacement)."""
    cols = {k: np.asarray(v, dtype=float) for k, v in columns.items()}
    n = len(next(iter(cols.values())))
    with np.errstate(divide="ignore", invalid="ignore"):
        point = float(np.asarray(stat({k: v[None, :] for k, v in cols.items()}))[0])
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, n, size=(resamples, n))
        vals = np.asarray(stat({k: v[idx] for k, v in cols.items()}), dtype=float)
    return point, vals[np.isfinite(vals)]


def bootstrap(
    columns: Mapping[str, Sequence[float]], stat: Stat, boot: Bootstrap | None = None
) -> tuple[float, float, float]:
    """(point, lo, hi): ``stat`` on every query, and ``boot``'s interval (default: the verdicts' own) over its
    resamples of the queries (rows) with replacement. ``columns``: equal-length per-query arrays, paired by
    position; ``stat`` maps ``{name: array of shape (R, n)}`` to R values (sums along the last axis)."""
    point, lo, hi, _ = estimate(columns, stat, math.nan, boot or DEFAULT)
    return point, lo, hi


def percentile_interval(vals: np.ndarray, level: float) -> tuple[float, float]:
    """The two-sided ``level`` percentile interval of resampled effects (nan, nan when none is finite)."""
    if not len(vals):
        return math.nan, math.nan
    a = (1 - level) / 2
    lo, hi = np.quantile(vals, [a, 1 - a])
    return float(lo), float(hi)


_NORMAL = NormalDist()


def t_cdf(x: float, df: int) -> float:
    """Student's t distribution function on ``df`` degrees of freedom (its density integrated by Simpson's rule on
    4,000 panels from 0: error below 1e-9 for |x| <= 50)."""
    if df < 1:
        raise ValueError(f"t_cdf needs at least one degree of freedom, got {df}")
    lim = min(abs(x), 50.0)
    grid = np.linspace(0.0, lim, 8001)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    dens = np.exp(log_c - (df + 1) / 2 * np.log1p(grid**2 / df))
    w = np.ones_like(grid)
    w[1:-1:2], w[2:-1:2] = 4, 2
    half = float(np.sum(w * dens) * (lim / 8000) / 3)
    return 0.5 + math.copysign(half, x)


def t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile of Student's t on ``df`` degrees of freedom (bisection on :func:`t_cdf`)."""
    if not 0 < q < 1:
        raise ValueError(f"t_quantile needs 0 < q < 1, got {q}")
    lo, hi = -50.0, 50.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
    return (lo + hi) / 2


def expansion(n: int) -> float:
    """sqrt(n / (n - 1)): the factor the expanded percentile interval applies to Student's t quantile."""
    return math.sqrt(n / (n - 1))


@functools.lru_cache(maxsize=256)
def expanded_level(level: float, n: int) -> float:
    """The percentile level of the expanded interval at ``n`` queries: the normal level whose quantile is
    sqrt(n / (n - 1)) times Student's t quantile of ``level`` on n - 1 degrees of freedom (about 97.2% for a 95%
    interval at n = 16, 95.5% at n = 80)."""
    if n < 2:
        return level
    z = expansion(n) * t_quantile(1 - (1 - level) / 2, n - 1)
    return 1 - 2 * (1 - _NORMAL.cdf(z))


@dataclass(frozen=True)
class Bca:
    """BCa's two constants: the bias correction ``z0`` (the normal quantile of the share of resamples below the
    point estimate) and the acceleration ``a`` (from the jackknife's skewness)."""

    z0: float
    a: float


def jackknife(columns: Mapping[str, Sequence[float]], stat: Stat) -> np.ndarray:
    """``stat`` on every leave-one-query-out subset (n values)."""
    cols = {k: np.asarray(v, dtype=float) for k, v in columns.items()}
    n = len(next(iter(cols.values())))
    keep = np.array([np.delete(np.arange(n), i) for i in range(n)])
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(stat({k: v[keep] for k, v in cols.items()}), dtype=float)


def bca_constants(columns: Mapping[str, Sequence[float]], stat: Stat, point: float, vals: np.ndarray) -> Bca:
    below = np.mean(vals < point) + 0.5 * np.mean(vals == point)
    z0 = _NORMAL.inv_cdf(float(np.clip(below, 1 / (len(vals) + 1), 1 - 1 / (len(vals) + 1))))
    jack = jackknife(columns, stat)
    jack = jack[np.isfinite(jack)]
    d = jack.mean() - jack if len(jack) else np.zeros(1)
    den = 6 * float(np.sum(d**2)) ** 1.5
    return Bca(z0, float(np.sum(d**3)) / den if den > 0 else 0.0)


def bca_interval(vals: np.ndarray, level: float, c: Bca) -> tuple[float, float]:
    """The BCa interval: the resamples' quantiles at Phi(z0 + (z0 + z) / (1 - a (z0 + z))) for z the normal
    quantiles of the two tails."""
    if not len(vals):
        return math.nan, math.nan
    qs = []
    for tail in ((1 - level) / 2, 1 - (1 - level) / 2):
        u = c.z0 + _NORMAL.inv_cdf(tail)
        qs.append(_NORMAL.cdf(c.z0 + u / (1 - c.a * u)) if 1 - c.a * u > 0 else (0.0 if tail < 0.5 else 1.0))
    lo, hi = np.quantile(vals, qs)
    return float(lo), float(hi)


def p_value(vals: np.ndarray, threshold: float) -> float:
    """The bootstrap p-value of "effect > threshold": twice the share of resampled effects at or below it (at
    least one resample's worth, at most 1), the two-sided equivalent of the percentile interval's level."""
    if not len(vals):
        return math.nan
    return tail_p(max(float(np.mean(vals <= threshold)), 1 / len(vals)), "percentile", len(vals))


def tail_p(share: float, method: str, n: int, bca: Bca | None = None) -> float:
    """The p-value of "effect > threshold" from the ``share`` of resampled effects at or below the threshold, for
    the interval ``method``: the alpha at which that interval's lower bound reaches the threshold (so the interval
    at ``level`` excludes it exactly when p < 1 - level). percentile: 2 * share; expanded: share's normal quantile
    shrunk by sqrt(n / (n - 1)) and read on Student's t (n - 1 df); bca: the BCa quantile map inverted."""
    share = min(max(share, 1e-300), 1.0)
    if method == "percentile" or share >= 1.0:
        return float(min(1.0, 2 * share))
    z = _NORMAL.inv_cdf(share)
    if method == "expanded":
        if n < 2:
            return float(min(1.0, 2 * share))
        return float(min(1.0, 2 * t_cdf(z / expansion(n), n - 1)))
    c = bca or Bca(0.0, 0.0)
    w = z - c.z0
    return float(min(1.0, 2 * _NORMAL.cdf(w / (1 + c.a * w) - c.z0))) if 1 + c.a * w > 0 else 1.0


def interval(vals: np.ndarray, boot: Bootstrap, n: int, bca: Bca | None = None) -> tuple[float, float]:
    """``boot.interval``'s two-sided ``boot.level`` interval from the resampled effects ``vals`` at ``n`` queries."""
    if boot.interval == "expanded":
        return percentile_interval(vals, expanded_level(boot.level, n))
    if boot.interval == "bca":
        return bca_interval(vals, boot.level, bca or Bca(0.0, 0.0))
    return percentile_interval(vals, boot.level)


def adaptive_p(
    columns: Mapping[str, Sequence[float]],
    stat: Stat,
    threshold: float,
    vals: np.ndarray,
    boot: Bootstrap,
    bca: Bca | None = None,
) -> float:
    """The p-value of "effect > threshold" for ``boot.interval`` (:func:`tail_p`) from the share of resampled effects at
    or below the threshold, resampled further while fewer than ``TAIL`` of ``vals`` (the interval's resamples) lie
    there (fresh seeds, in chunks of at most ``CHUNK``), up to ``boot.max_resamples``; where none of them does, the
    share is the resamples' normal tail (:func:`normal_tail`), at most one resample's worth. So a p-value resolves far
    below the 2 / 2000 floor of the interval's own resamples, and below Holm's thresholds over hundreds of claims
    for an effect far from its null."""
    below, total = int(np.sum(vals <= threshold)), len(vals)
    seed = boot.seed + 1
    while below < TAIL and 0 < total < boot.max_resamples:
        _, more = resample(columns, stat, min(CHUNK, 9 * total, boot.max_resamples - total), seed)
        seed += 1
        if not len(more):
            break
        below, total = below + int(np.sum(more <= threshold)), total + len(more)
    if not total:
        return math.nan
    n = len(next(iter(columns.values())))
    share = below / total if below else min(1 / total, normal_tail(vals, threshold))
    return tail_p(share, boot.interval, n, bca)


def normal_tail(vals: np.ndarray, threshold: float) -> float:
    """The share of resampled effects at or below ``threshold`` that a normal law of their mean and spread puts
    there: where not one of ``MAX_RESAMPLES`` resamples falls on the null's side, the tail is extrapolated from it
    (capped by the caller at one resample's worth, so it never reads larger than what was resolved)."""
    sd = float(np.std(vals))
    if not sd > 0:
        return 0.0 if float(np.mean(vals)) > threshold else 1.0
    return _NORMAL.cdf((threshold - float(np.mean(vals))) / sd)


T_FLOOR = 1e-9  # the jackknife t p-value's floor: the precision of ``t_cdf``'s integration


def jackknife_t(columns: Mapping[str, Sequence[float]], stat: Stat, threshold: float, level: float):
    """``(point, lo, hi, p)`` of the jackknife t interval: the point estimate plus or minus Student's t quantile of
    ``level`` (n - 1 df) times the jackknife standard error sqrt((n - 1) / n * sum (theta_i - mean)^2), and the
    p-value of "effect > threshold" on the same law (nan / None unless every leave-one-out value is finite and there
    are at least two)."""
    point, _ = resample(columns, stat, 1, SEED)
    jack = jackknife(columns, stat)
    n = len(jack)
    jack = jack[np.isfinite(jack)]
    if len(jack) < 2 or len(jack) < n or not math.isfinite(point):
        return point, math.nan, math.nan, None
    se = math.sqrt((n - 1) / n * float(np.sum((jack - jack.mean()) ** 2)))
    half = t_quantile(1 - (1 - level) / 2, n - 1) * se
    if math.isnan(threshold):
        p = None
    elif se > 0:
        p = float(min(1.0, max(T_FLOOR, 2 * t_cdf((threshold - point) / se, n - 1))))
    else:
        p = T_FLOOR if point > threshold else 1.0
    return point, point - half, point + half, p


def estimate(columns: Mapping[str, Sequence[float]], stat: Stat, threshold: float, boot: Bootstrap):
    """``(point, lo, hi, p)``: ``stat`` on every query, its ``boot.interval`` interval at ``boot.level`` and the
    p-value of "effect > threshold" (``adaptive_p``; the jackknife t's own law for ``t``); nan / None where no
    resample is finite."""
    if boot.interval == "t":
        return jackknife_t(columns, stat, threshold, boot.level)
    point, vals = resample(columns, stat, boot.resamples, boot.seed)
    n = len(next(iter(columns.values())))
    bca = bca_constants(columns, stat, point, vals) if boot.interval == "bca" and len(vals) else None
    lo, hi = interval(vals, boot, n, bca)
    tested = len(vals) and not math.isnan(threshold)  # nan: an interval only (``bootstrap``)
    return point, lo, hi, (adaptive_p(columns, stat, threshold, vals, boot, bca) if tested else None)


def side_of(lo: float, hi: float, threshold: float, at_least: bool) -> bool | None:
    """Where an interval lies against a claim's threshold: True above it, False at or below it (``at_least``:
    strictly below it), None across it."""
    if lo > threshold:
        return True
    if hi < threshold or (hi <= threshold and not at_least):
        return False
    return None


def judge(
    claim: str,
    columns: Mapping[str, Sequence[float]],
    stat: Stat,
    threshold: float,
    label: str,
    *,
    at_least: bool = False,
    detail: str = "",
    boot: Bootstrap = DEFAULT,
) -> Verdict:
    """The claim "``stat`` > ``threshold``" (``at_least``: "``stat`` >= ``threshold``", e.g. 0.95 of the
    oracle) on paired per-query ``columns``, with ``boot``'s interval. held: the interval lies strictly above the
    threshold; not held: it lies at or below it (``at_least``: strictly below it); inconclusive: it straddles the
    threshold; not judged below ``boot.min_n`` paired queries (n < 16)."""
    level, min_n = boot.level, boot.min_n
    n = len(next(iter(columns.values()))) if columns else 0
    point, lo, hi, p = estimate(columns, stat, threshold, boot) if n else (math.nan, math.nan, math.nan, None)
    if n < min_n:  # shown, never judged
        return Verdict(
            claim,
            None,
            f"fewer than {min_n} paired queries" + (f"; {detail}" if detail else ""),
            n=n,
            label=label,
            level=level,
            reason=f"n < {min_n}",
            effect=point if n else None,
            interval=(lo, hi) if _ok(lo, hi) else None,
            threshold=threshold,
        )
    if not _ok(point, lo, hi):
        return Verdict(
            claim,
            None,
            "the effect cannot be estimated on these queries" + (f"; {detail}" if detail else ""),
            n=n,
            label=label,
            level=level,
            reason=NOT_ESTIMABLE,
        )
    held = side_of(lo, hi, threshold, at_least)
    side = ">=" if at_least else ">"
    note = f"claim: {label} {side} {threshold:g}" + (f"; {detail}" if detail else "")
    return Verdict(
        claim,
        held,
        note,
        n=n,
        effect=point,
        interval=(lo, hi),
        label=label,
        level=level,
        reason="" if held is not None else INCONCLUSIVE,
        threshold=threshold,
        p=p,
    )


# ---------------------------------------------------------------- statistics of paired per-query columns
def seconds_per_token(seconds: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    return seconds.sum(axis=-1) / tokens.sum(axis=-1)


def speed_ratio(a: str = "a", b: str = "b") -> Stat:
    """How much faster ``a`` is than ``b``: (b's total seconds per token) / (a's), over the same queries (the
    ratio of their speedups over any shared baseline). Columns ``<name>_s`` (seconds) and ``<name>_t`` (tokens)."""
    return lambda c: seconds_per_token(c[f"{b}_s"], c[f"{b}_t"]) / seconds_per_token(c[f"{a}_s"], c[f"{a}_t"])


def ratio_of_sums(num: str, den: str) -> Stat:
    return lambda c: c[num].sum(axis=-1) / c[den].sum(axis=-1)


def mean_difference(a: str, b: str) -> Stat:
    return lambda c: (c[a] - c[b]).mean(axis=-1)


def mean_of(a: str) -> Stat:
    return lambda c: c[a].mean(axis=-1)


Timed = tuple[Sequence[float], Sequence[float]]  # (seconds, new tokens) per paired query


def faster(
    claim: str,
    a: Timed,
    b: Timed,
    names: tuple[str, str] = ("a", "b"),
    threshold: float = 1.0,
    at_least: bool = False,
    what: str = "speedup ratio",
    **kw,
) -> Verdict:
    """``a`` faster than ``b`` (``threshold`` 1), or at least ``threshold`` of ``b``'s speed (``at_least``),
    judged on the per-query seconds and tokens of the same queries (or target calls and tokens: ``what`` names
    the ratio, e.g. ``tokens per target call ratio``)."""
    cols = {"a_s": a[0], "a_t": a[1], "b_s": b[0], "b_t": b[1]}
    label = f"{what} {names[0]} / {names[1]}"
    return judge(claim, cols, speed_ratio(), threshold, label, at_least=at_least, **kw)


def non_inferior(
    claim: str, a: Timed, b: Timed, margin: float, names: tuple[str, str] = ("a", "b"), **kw
) -> Verdict:
    """``a`` keeps ``b``'s speed up to a stated non-inferiority ``margin`` (e.g. 0.03: at least 0.97 of it);
    the margin is part of the claim and of the line."""
    v = faster(claim, a, b, names, threshold=1 - margin, at_least=True, **kw)
    return replace(v, detail=f"non-inferiority margin {margin:.0%} (stated); {v.detail}")


def greater_mean(
    claim: str, a: Sequence[float], b: Sequence[float], label: str, threshold: float = 0.0, **kw
) -> Verdict:
    """The mean per-query difference ``a - b`` is above ``threshold`` (0: ``a`` is larger)."""
    return judge(claim, {"a": a, "b": b}, mean_difference("a", "b"), threshold, label, **kw)


def majority(claim: str, hits: Sequence[float], label: str = "share", **kw) -> Verdict:
    """More than half of the queries are hits (1/0 per query): the interval of the share lies above 0.5."""
    return judge(claim, {"hit": hits}, mean_of("hit"), 0.5, label, **kw)


# ---------------------------------------------------------------- claims made of several comparisons
def _above(p: Verdict) -> float:
    """How far a part's interval lies above its threshold (its lower bound minus the threshold)."""
    return p.interval[0] - (p.threshold or 0.0) if p.interval else -math.inf


def _below(p: Verdict) -> float:
    """How far a part's interval lies below its threshold (the threshold minus its upper bound)."""
    return (p.threshold or 0.0) - p.interval[1] if p.interval else -math.inf


def _pick(parts: Sequence[Verdict], mark) -> Verdict:
    chosen = [p for p in parts if p.held is mark]
    # the deciding part: a held claim's weakest part (nearest its threshold); a failed one's clearest failure
    return min(chosen, key=_above) if mark is True else max(chosen, key=_below)


def _combine(
    claim: str,
    parts: Sequence[tuple[str, Verdict]],
    held: bool | None,
    deciding: Verdict,
    detail: str = "",
    shown: int = 8,
    p: float | None = None,
) -> Verdict:
    listed = [f"{name}: {p.mark}, {p.stats}" for name, p in parts]
    if len(listed) > shown:
        count = {m: sum(p.mark == m for _, p in parts) for m in MARKS}
        deciding_i = next(i for i, (_, p) in enumerate(parts) if p is deciding)
        keep = sorted({deciding_i, *range(shown - 1)})
        listed = [listed[i] for i in keep] + [
            f"... {len(parts) - len(keep)} more parts (of all {len(parts)}: "
            + ", ".join(f"{v} {m}" for m, v in count.items())
            + ")"
        ]
    text = "; ".join(([detail] if detail else []) + listed)
    return Verdict(
        claim,
        held,
        text,
        n=deciding.n,
        effect=deciding.effect,
        interval=deciding.interval,
        label=deciding.label,
        level=deciding.level,
        threshold=deciding.threshold,
        reason="" if held is not None else (deciding.reason or INCONCLUSIVE),
        p=deciding.p if p is None else p,
    )


def all_of(claim: str, parts: Sequence[tuple[str, Verdict]], detail: str = "") -> Verdict:
    """Held when every part holds, not held when one does not, else not judged; n, effect and interval
    are the deciding part's (the first failure, or the weakest held or undecided part)."""
    if not parts:
        return missing(claim, "no comparison to make")
    vs = [p for _, p in parts]
    if any(v.held is False for v in vs):
        return _combine(claim, parts, False, _pick(vs, False), detail)
    if all(v.held is True for v in vs):  # an intersection-union test: its p-value is the largest part's
        return _combine(claim, parts, True, _pick(vs, True), detail, p=_largest_p(vs))
    return _combine(claim, parts, None, _undecided(vs), detail, p=_largest_p(vs))


def _largest_p(vs: Sequence[Verdict]) -> float | None:
    ps = [v.p for v in vs]
    return None if any(x is None for x in ps) else max(ps)


def _undecided(vs: Sequence[Verdict]) -> Verdict:
    """The part an undecided claim is shown by: one not judged (too few queries, no data) before an inconclusive one."""
    return next((v for v in vs if v.held is None and v.mark == "not judged"), None) or next(
        v for v in vs if v.held is None
    )


def any_of(claim: str, parts: Sequence[tuple[str, Verdict]], detail: str = "") -> Verdict:
    """Held when some part holds, not held when every part does not, else not judged. Give each part a
    Bonferroni-corrected level (``bonferroni``) when the parts are alternatives picked from."""
    if not parts:
        return missing(claim, "no comparison to make")
    vs = [p for _, p in parts]
    # picked from k alternatives: the smallest p-value, Bonferroni-adjusted (times k)
    ps = [v.p for v in vs if v.p is not None]
    p = min(1.0, len(vs) * min(ps)) if ps else None
    if any(v.held is True for v in vs):
        best = max((v for v in vs if v.held is True), key=_above)
        return _combine(claim, parts, True, best, detail, p=p)
    if all(v.held is False for v in vs):
        return _combine(claim, parts, False, min(vs, key=_below), detail, p=p)  # the nearest miss
    return _combine(claim, parts, None, _undecided(vs), detail, p=p)


def inside_error(v: Verdict, error: float, what: str) -> Verdict:
    """``v`` made inconclusive when its effect lies within a relative ``error`` of its threshold (``what``: the
    error's source, e.g. the replay clock's measured error): a held or not-held speed verdict there could be the
    error's doing. Other verdicts, and a non-positive or unknown error, pass unchanged."""
    t = v.threshold
    if v.held is None or v.effect is None or t is None or not error > 0 or not math.isfinite(error):
        return v
    if not t / (1 + error) <= v.effect <= t * (1 + error):
        return v
    note = f"{v.mark} on its interval, but its effect lies inside {what} (+-{error:.1%} around {t:g})"
    return replace(v, held=None, reason=INCONCLUSIVE, detail=f"{note}; {v.detail}" if v.detail else note)


def bonferroni(k: int, level: float = LEVEL) -> float:
    """The per-comparison level that keeps ``k`` alternatives at ``level`` together."""
    return 1 - (1 - level) / max(k, 1)


# ---------------------------------------------------------------- the report's family of claims
FAMILY_LEVEL = 1 - LEVEL  # the family-wise error rate Holm's correction keeps across a report (5%)


def holm(verdicts: Sequence[Verdict], alpha: float = FAMILY_LEVEL) -> list[Verdict]:
    """Holm's step-down correction across a report's verdicts (the family: every verdict with a p-value, i.e.
    every claim tested at an adequate n). Sorted by p, the i-th smallest of m is rejected (the claim stands) while
    ``p <= alpha / (m - i + 1)``; at the first that fails, it and every larger one are not rejected. A verdict held
    at its own level whose claim is not rejected becomes ``inconclusive`` and says why; every tested verdict's
    line states its p-value and Holm threshold. Verdicts not tested (no p) are returned unchanged, in order."""
    tested = sorted(
        (i for i, v in enumerate(verdicts) if v.p is not None and not math.isnan(v.p)),
        key=lambda i: verdicts[i].p,
    )
    m = len(tested)
    out = list(verdicts)
    stopped = False
    for rank, i in enumerate(tested):
        v = verdicts[i]
        limit = alpha / (m - rank)
        stopped = stopped or v.p > limit
        note = (
            f"Holm over {m} tested claims: p={v.p:.2g}, {'above' if stopped else 'within'} its threshold "
            f"{limit:.2g}"
        )
        if v.held is True and stopped:
            out[i] = replace(
                v,
                held=None,
                reason=INCONCLUSIVE,
                detail=f"held at its own {v.level:.0%} level, not after the family-wise correction; "
                f"{note}" + (f"; {v.detail}" if v.detail else ""),
            )
        else:
            out[i] = replace(v, detail=f"{v.detail}; {note}" if v.detail else note)
    return out


def expected_false_holds(verdicts: Sequence[Verdict], alpha: float = FAMILY_LEVEL) -> float:
    """Without a correction: the expected number of claims held by chance if none were true (``alpha / 2`` per
    tested claim: a one-sided error at a two-sided level)."""
    return sum(v.p is not None for v in verdicts) * alpha / 2
