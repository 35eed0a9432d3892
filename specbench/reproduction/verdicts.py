"""Pattern verdicts: each checks one claim of a paper on per-query PAIRED data, with a confidence interval.

Every comparison of speeds or qualities is judged on the queries both sides ran (paired by query id), with an
interval over queries at a stated level (``LEVEL``: 95%, two-sided) made by the interval engine (``intervals.py``:
the jackknife t interval by default, chosen by its A/A false-hold rate at small n, or a seeded bootstrap). A claim
"effect > x" (x: the null, e.g. a speedup ratio of 1, or a threshold such as 0.95 of the oracle) is

- ``held`` only when the whole interval lies above x (strictly: a tie is never held; no tolerance turns
  ``>`` into ``>=``);
- ``not held`` when the interval excludes the claim (it lies at or below x; for an "at least x" claim,
  entirely below x);
- ``inconclusive`` when the interval straddles x at an adequate n (the data cannot tell);
- ``not judged (n < 16)`` when fewer than ``MIN_N`` paired queries exist (16: what a speed claim on one task
  cell needs here), and ``not judged`` when the data have no per-query form (``unpaired``) or are missing
  (``missing``).

Each judged verdict also carries a p-value for its claim (``p``: the level at which the interval's bound reaches x,
so ``p < 1 - LEVEL`` exactly when the interval excludes x on the claim's side; ``intervals.estimate``). A report
judges many claims at once, so :func:`holm` applies Holm's step-down correction across all of them: a verdict
held at its own level stays held only if its p-value passes Holm's threshold at the family-wise level
``1 - LEVEL``; one that does not becomes ``inconclusive`` and says so.

Each line shows n, the effect and its interval (e.g. ``**held**: ... (n=16, speedup ratio 1.210, 95% CI
[1.080, 1.350]; ...)``, ``**not judged**: ... (n < 16; n=3, ...)``); a claim made of several comparisons
(``all_of``, ``any_of``) shows the deciding one and lists every part.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from specbench.reproduction.intervals import (
    DEFAULT,
    LEVEL,
    MIN_N,
    Bootstrap,
    Stat,
    estimate,
    mean_difference,
    mean_of,
    p_below,
    speed_ratio,
)

N_SMALL = f"n < {MIN_N}"
INCONCLUSIVE = "inconclusive"  # the interval straddles the claim's threshold at an adequate n
NOT_ESTIMABLE = "effect not estimable"
NO_PAIRS = "no per-query data"
UNSTABLE = (
    "unstable"  # its mark differs between two runs of the same plan (``stability``): never counted held
)
# its premise (``premises.py``: the condition of the setup the claim presupposes) fails here: judged neither way
NOT_TESTABLE = "not testable here"
MARKS = ("held", "not held", "inconclusive", "not judged", "unstable", NOT_TESTABLE)


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
    # the p-value of the claim's failure (the level at which the interval's upper bound reaches the threshold): what
    # Holm's correction reads for a "not held" verdict, as it reads ``p`` for a "held" one
    p_not: float | None = None
    key: str = ""  # the part's key (``<exhibit>#<name>``): how a statement names the parts it is made of

    def __post_init__(self):  # numpy booleans / numbers from table arithmetic become plain ones
        if self.held is not None:
            object.__setattr__(self, "held", bool(self.held))
        if self.effect is not None:
            object.__setattr__(self, "effect", float(self.effect))
        if self.interval is not None:
            object.__setattr__(self, "interval", (float(self.interval[0]), float(self.interval[1])))

    @property
    def mark(self) -> str:
        if self.held is None and self.reason in (INCONCLUSIVE, UNSTABLE, NOT_TESTABLE):
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
            if self.held is None and self.reason and self.reason not in (INCONCLUSIVE, UNSTABLE, NOT_TESTABLE)
            else ""
        )
        detail = f"; {self.detail}" if self.detail else ""
        return f"**{self.mark}**: {self.claim} ({why}{self.stats}{detail})"


def keyed(v: Verdict, key: str) -> Verdict:
    """``v`` as the part ``key`` (``<exhibit>#<name>``: how statements name their parts)."""
    return replace(v, key=key)


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
        key=verdict.key,
    )  # no p: not part of the tested family


def missing(claim: str, what: str, label: str = "") -> Verdict:
    return Verdict(claim, None, f"missing: {what}", label=label, n=0, reason="missing data")


def unpaired(claim: str, why: str, label: str = "") -> Verdict:
    """A claim whose data have no per-query form (an aggregate table): kept, never judged; ``why`` says why."""
    return Verdict(claim, None, why, label=label, n=0, reason=NO_PAIRS)


# ---------------------------------------------------------------- judging one claim


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
    p_not = p_below(columns, stat, threshold, boot) if p is not None else None
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
        p_not=p_not,
    )


# ---------------------------------------------------------------- claims on paired per-query columns


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
    p_not: float | None = None,
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
        p_not=p_not,
    )


def all_of(claim: str, parts: Sequence[tuple[str, Verdict]], detail: str = "") -> Verdict:
    """Held when every part holds, not held when one does not, else not judged; n, effect and interval
    are the deciding part's (the first failure, or the weakest held or undecided part)."""
    if not parts:
        return missing(claim, "no comparison to make")
    vs = [p for _, p in parts]
    # the statement fails when one part fails: the smallest failure p-value, Bonferroni-adjusted over the parts
    fails = _bonferroni_p([v.p_not for v in vs])
    if any(v.held is False for v in vs):
        return _combine(claim, parts, False, _pick(vs, False), detail, p_not=fails)
    if all(v.held is True for v in vs):  # an intersection-union test: its p-value is the largest part's
        return _combine(claim, parts, True, _pick(vs, True), detail, p=_largest_p(vs), p_not=fails)
    return _combine(claim, parts, None, _undecided(vs), detail, p=_largest_p(vs), p_not=fails)


def _bonferroni_p(ps: Sequence[float | None]) -> float | None:
    """The smallest of ``ps`` times how many there are (at most 1): one of k alternatives picked; None without any."""
    known = [x for x in ps if x is not None and not math.isnan(x)]
    return min(1.0, len(known) * min(known)) if known else None


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
    # it fails only when every part fails (an intersection-union test of the failures): the largest failure p-value
    nots = [v.p_not for v in vs]
    fails = None if any(x is None for x in nots) else max(nots)
    if any(v.held is True for v in vs):
        best = max((v for v in vs if v.held is True), key=_above)
        return _combine(claim, parts, True, best, detail, p=p, p_not=fails)
    if all(v.held is False for v in vs):  # the nearest miss
        return _combine(claim, parts, False, min(vs, key=_below), detail, p=p, p_not=fails)
    return _combine(claim, parts, None, _undecided(vs), detail, p=p, p_not=fails)


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
    every claim tested at an adequate n), applied to both conclusions: a claim *held* must pass it on its p-value
    (``p``), a claim *not held* on the p-value of its failure (``p_not``). Sorted by p, the i-th smallest of m is
    rejected while ``p <= alpha / (m - i + 1)``; at the first that fails, it and every larger one are not rejected.
    A verdict held (or not held) at its own level whose conclusion is not rejected becomes ``inconclusive`` and says
    why; every tested verdict's line states its p-value and Holm threshold. Verdicts not tested (no p) are returned
    unchanged, in order."""
    out = list(verdicts)
    for side, attr in ((True, "p"), (False, "p_not")):
        passed = _holm_pass([getattr(v, attr) for v in verdicts], alpha)
        for i, (ok, p, limit, m) in passed.items():
            v = out[i]
            word = "p" if side else "p of its failure"
            note = f"Holm over {m} tested claims: {word}={p:.2g}, {'within' if ok else 'above'} its threshold {limit:.2g}"
            if v.held is side and not ok:
                conclusion = "held" if side else "not held"
                out[i] = replace(
                    v,
                    held=None,
                    reason=INCONCLUSIVE,
                    detail=f"{conclusion} at its own {v.level:.0%} level, not after the family-wise correction; "
                    f"{note}" + (f"; {v.detail}" if v.detail else ""),
                )
            elif side or v.held is False:  # every tested line states its p; a not-held one also its failure's
                out[i] = replace(v, detail=f"{v.detail}; {note}" if v.detail else note)
    return out


def _holm_pass(ps: Sequence[float | None], alpha: float) -> dict[int, tuple[bool, float, float, int]]:
    """Holm's step-down over the known values of ``ps``: index -> (rejected, p, its threshold, m)."""
    tested = sorted((i for i, p in enumerate(ps) if p is not None and not math.isnan(p)), key=lambda i: ps[i])
    m = len(tested)
    found, stopped = {}, False
    for rank, i in enumerate(tested):
        limit = alpha / (m - rank)
        stopped = stopped or ps[i] > limit
        found[i] = (not stopped, float(ps[i]), limit, m)
    return found


def expected_false_holds(verdicts: Sequence[Verdict], alpha: float = FAMILY_LEVEL) -> float:
    """Without a correction: the expected number of claims held by chance if none were true (``alpha / 2`` per
    tested claim: a one-sided error at a two-sided level)."""
    return sum(v.p is not None for v in verdicts) * alpha / 2
