"""Pattern verdicts: each checks one claim of a paper on our numbers (pure functions of tables).

A verdict holds (True), fails (False) or cannot be judged (None: a number it needs is missing, or
the run it reads did not finish: ``unfinished``);
``detail`` gives the numbers it used, so a reader can check it by hand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    claim: str
    held: bool | None
    detail: str
    unfinished: str = ""  # why a verdict on an unfinished run is not judged (empty: the run finished)

    def __post_init__(self):  # numpy booleans from table arithmetic become plain ones
        if self.held is not None:
            object.__setattr__(self, "held", bool(self.held))

    @property
    def mark(self) -> str:
        return {True: "held", False: "not held", None: "not judged"}[self.held]

    def line(self) -> str:
        return f"**{self.mark}**: {self.claim} ({self.detail})"


def _ok(*values) -> bool:
    return all(v is not None and not (isinstance(v, float) and math.isnan(v)) for v in values)


def _fmt(x) -> str:
    return "nan" if not _ok(x) else f"{x:.3f}"


def unfinished(verdict: Verdict, why: str) -> Verdict:
    """``verdict`` not judged: the run it reads stopped before it finished (``why``), so its numbers are partial."""
    return Verdict(verdict.claim, None, f"{why}; on the finished part: {verdict.detail}", unfinished=why)


def missing(claim: str, what: str) -> Verdict:
    return Verdict(claim, None, f"missing: {what}")


def each_fastest_on_own_task(speed: Mapping[str, Mapping[str, float]], own: Mapping[str, str],
                             claim: str = "each specialist is the fastest single drafter on its own task") -> Verdict:
    """``speed[task][drafter]``; ``own[drafter] = task``. Holds when, on every task that has a
    specialist, that specialist's speed is the highest among all drafters listed for the task."""
    parts, held = [], True
    for drafter, task in own.items():
        row = {d: v for d, v in (speed.get(task) or {}).items() if _ok(v)}
        if drafter not in row:
            return missing(claim, f"{drafter} on {task}")
        best = max(row, key=row.get)
        held &= best == drafter
        parts.append(f"{task}: {drafter} {row[drafter]:.3f}, best {best} {row[best]:.3f}")
    return Verdict(claim, held, "; ".join(parts))


def specialist_margin(speed: Mapping[str, Mapping[str, float]], own: Mapping[str, str], generalist: str,
                      margin: float = 0.15) -> Verdict:
    """On each task, its specialist is at least ``margin`` faster than the mean of the other specialists
    and than the generalist."""
    claim = f"each specialist is at least {margin:.0%} faster on its task than the other specialists' mean and the generalist"
    parts, held = [], True
    for drafter, task in own.items():
        row = speed.get(task) or {}
        others = [row.get(d) for d in own if d != drafter]
        if not _ok(row.get(drafter), row.get(generalist), *others):
            return missing(claim, f"speeds on {task}")
        mean_others = sum(others) / len(others)
        gain_o, gain_g = row[drafter] / mean_others - 1, row[drafter] / row[generalist] - 1
        held &= gain_o >= margin and gain_g >= margin
        parts.append(f"{task}: {gain_o:+.0%} vs others, {gain_g:+.0%} vs {generalist}")
    return Verdict(claim, held, "; ".join(parts))


def at_least_fraction(value: float, reference: float, fraction: float, claim: str, names=("ours", "reference")) -> Verdict:
    if not _ok(value, reference):
        return missing(claim, f"{names[0]} or {names[1]}")
    return Verdict(claim, value >= fraction * reference,
                   f"{names[0]} {_fmt(value)} = {value / reference:.3f} of {names[1]} {_fmt(reference)}")


def above(value: float, reference: float, claim: str, names=("ours", "reference"), tolerance: float = 0.0) -> Verdict:
    """``value > reference`` (or ``>= reference * (1 - tolerance)`` when a tolerance is given)."""
    if not _ok(value, reference):
        return missing(claim, f"{names[0]} or {names[1]}")
    held = value > reference if tolerance == 0 else value >= reference * (1 - tolerance)
    return Verdict(claim, held, f"{names[0]} {_fmt(value)} vs {names[1]} {_fmt(reference)}")


def within_of_best_everywhere(policy: Mapping[str, float], best: Mapping[str, float], fraction: float,
                              claim: str) -> Verdict:
    """On every task, ``policy[task] >= fraction * best[task]``."""
    if not best:
        return missing(claim, "tasks")
    parts, held = [], True
    for task, b in best.items():
        p = policy.get(task)
        if not _ok(p, b):
            return missing(claim, f"speeds on {task}")
        held &= p >= fraction * b
        parts.append(f"{task}: {p:.3f} / {b:.3f} = {p / b:.2f}")
    return Verdict(claim, held, "; ".join(parts))


def choice_moves(shares_low: Mapping[str, float], shares_high: Mapping[str, float], cheap: str, aligned: str,
                 claim: str) -> Verdict:
    """The cheap arm has the majority at the lowest alpha and the aligned arm at the highest."""
    lo, hi = shares_low.get(cheap), shares_high.get(aligned)
    if not _ok(lo, hi):
        return missing(claim, "shares")
    return Verdict(claim, lo >= 0.5 and hi >= 0.5,
                   f"share of {cheap} at the lowest alpha {lo:.2f}; share of {aligned} at the highest {hi:.2f}")


def faster_at_equal_quality(points: list[dict], rule_key: str = "rule", baseline: str = "lossy_sd",
                            claim: str = "a deferral rule is faster than lossy SD at equal or better quality") -> Verdict:
    """``points``: ``{rule, alpha, speedup, quality}``. Holds when some point of a rule other than the
    baseline dominates a baseline point: speedup above it at quality at least its quality."""
    base = [p for p in points if p[rule_key] == baseline and _ok(p["speedup"], p["quality"])]
    rules = [p for p in points if p[rule_key] not in (baseline, None) and _ok(p["speedup"], p["quality"])]
    if not base or not rules:
        return missing(claim, "points of lossy SD or of a deferral rule")
    wins = [(r, b) for r in rules for b in base if r["speedup"] > b["speedup"] and r["quality"] >= b["quality"]]
    if not wins:
        best_b = max(base, key=lambda p: p["speedup"])
        return Verdict(claim, False, f"no rule point dominates a lossy SD point (fastest lossy SD: speedup "
                                     f"{best_b['speedup']:.3f} at quality {best_b['quality']:.3f})")
    r, b = max(wins, key=lambda w: w[0]["speedup"] - w[1]["speedup"])
    return Verdict(claim, True, f"{r[rule_key]} alpha {r['alpha']}: speedup {r['speedup']:.3f} at quality "
                                f"{r['quality']:.3f} vs lossy SD alpha {b['alpha']}: {b['speedup']:.3f} at {b['quality']:.3f}")
