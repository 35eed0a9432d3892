"""The interval engine of every verdict (``verdicts.py``): a statistic of paired per-query columns, its interval
over queries at a stated level (``LEVEL``: 95%, two-sided) and the p-value of a threshold.

``INTERVAL`` says how: the jackknife t interval (the point estimate plus or minus Student's t quantile times the
jackknife's standard error, its p-value read on the same t law), chosen by its A/A false-hold rate at small n
(``make aa-cpu``), or a seeded bootstrap (``RESAMPLES`` resamples of the queries, ``numpy.random.default_rng(SEED)``)
read as a percentile, expanded or BCa interval. A bootstrap p-value is the share of resampled effects on the null's
side of the threshold; where fewer than ``TAIL`` of the interval's resamples fall there, more are drawn
(``adaptive_p``, up to ``MAX_RESAMPLES``), so a p-value resolves far below the 2 / 2000 floor of the interval's own
resamples. ``Bootstrap`` bundles a claim's settings (level, resamples, seed, the fewest queries judged, the method);
``estimate`` gives (point, low, high, p); the ``Stat`` builders (``speed_ratio``, ``ratio_of_sums``,
``mean_difference``, ``mean_of``) are the statistics the verdicts judge.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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


def p_below(
    columns: Mapping[str, Sequence[float]], stat: Stat, threshold: float, boot: Bootstrap
) -> float | None:
    """The p-value of "effect < threshold" (the claim "effect > threshold" failing): the level at which the interval's
    upper bound reaches the threshold, read as :func:`estimate` reads the claim's own (the same interval, mirrored)."""
    return estimate(columns, lambda c: -np.asarray(stat(c), dtype=float), -threshold, boot)[3]


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
