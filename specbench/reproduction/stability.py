"""Do the verdicts stand? The same plan run twice (two roots), each verdict compared between them.

``specbench report ROOT --against OTHER`` builds both roots' exhibits (each corrected by Holm within its own
root), pairs their verdicts by exhibit and claim, and:

- marks every verdict whose mark differs between the two runs ``unstable`` (:data:`UNSTABLE`): never counted held,
  whichever side held, with both marks and both effects in its line. Only a claim judged on as many queries in
  both runs is compared (``Pair.repeated``): one judged on other data in one run is listed, not marked;
- writes ``STABILITY.md``: each verdict in both runs, the flips first, then the claims one run lacks.

A verdict that reads the same in both runs keeps its mark and its line; the page says how far its effect moved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from specbench.pipelines.tables import to_markdown
from specbench.reproduction import verdicts as V
from specbench.reproduction.exhibit import Exhibit

STABILITY = "STABILITY.md"


@dataclass(frozen=True)
class Pair:
    """One claim of one exhibit in both runs (``None``: that run has no such verdict)."""

    key: str
    claim: str
    here: V.Verdict | None
    there: V.Verdict | None

    @property
    def repeated(self) -> bool:
        """Both runs judged it on as many queries: the same design run again. A claim judged on other data in one
        run (its n differs: a run outside the plan, such as ``make huang-fig3``'s, under one root only, or one
        that did not finish) is not a rerun of it, so its marks are not compared."""
        return self.here is not None and self.there is not None and self.here.n == self.there.n

    @property
    def flipped(self) -> bool:
        return self.repeated and self.here.mark != self.there.mark


def pairs(here: Sequence[Exhibit], there: Sequence[Exhibit]) -> list[Pair]:
    """Every (exhibit key, claim) of either run, in this run's order (then the other's leftovers). A claim judged
    twice in one exhibit is paired by its occurrence (first with first)."""

    def index(exhibits):
        out: dict[tuple[str, str, int], V.Verdict] = {}
        for ex in exhibits:
            seen: dict[str, int] = {}
            for v in ex.verdicts:
                k = seen[v.claim] = seen.get(v.claim, -1) + 1
                out[(ex.key, v.claim, k)] = v
        return out

    a, b = index(here), index(there)
    keys = list(a) + [k for k in b if k not in a]
    return [Pair(key, claim, a.get((key, claim, k)), b.get((key, claim, k))) for key, claim, k in keys]


def unstable(here: V.Verdict, there: V.Verdict, other: str) -> V.Verdict:
    """``here`` marked unstable: its mark differs from ``there``'s, the same claim judged on ``other``'s runs."""
    return replace(
        here,
        held=None,
        reason=V.UNSTABLE,
        detail=f"{here.mark} in this run ({here.stats}), {there.mark} in {other} ({there.stats})"
        + (f"; {here.detail}" if here.detail else ""),
    )


def mark_unstable(here: list[Exhibit], there: list[Exhibit], other: str) -> list[Pair]:
    """Mark (in place) every verdict of ``here`` that flips against ``there`` (:func:`unstable`); the pairs, as they
    were before the marking (for :func:`page`)."""
    found = pairs(here, there)
    flips = {(p.key, id(p.here)): p.there for p in found if p.flipped}
    for ex in here:
        ex.verdicts = [
            unstable(v, flips[(ex.key, id(v))], other) if (ex.key, id(v)) in flips else v for v in ex.verdicts
        ]
    return found


def _effect(v: V.Verdict | None) -> str:
    if v is None:
        return "(not in this run)"
    if v.effect is None:
        return v.mark
    ci = f" [{v.interval[0]:.3f}, {v.interval[1]:.3f}]" if v.interval else ""
    return f"{v.mark}: {v.effect:.3f}{ci}"


def page(found: list[Pair], here: str, there: str) -> str:
    """``STABILITY.md``: the counts, then one row per claim (flips first) with its mark and effect in each run."""
    import pandas as pd

    both = [p for p in found if p.repeated]
    flips = [p for p in both if p.flipped]
    held_both = [p for p in both if not p.flipped and p.here.held is True]
    other = [p for p in found if p.here is not None and p.there is not None and not p.repeated]
    lone = [p for p in found if p.here is None or p.there is None]
    ordered = flips + [p for p in both if not p.flipped] + other + lone
    table = pd.DataFrame(
        [
            {
                "exhibit": p.key,
                "claim": p.claim,
                "stable": "other data" if p in other else "" if p in lone else ("no" if p.flipped else "yes"),
                here: _effect(p.here),
                there: _effect(p.there),
            }
            for p in ordered
        ]
    )
    lines = [
        "# Stability: the same plan run twice",
        "",
        f"Built by `specbench report {here} --against {there}`: each verdict of the two runs, paired by exhibit "
        "and claim (each run corrected by Holm within itself). A verdict whose mark differs between the runs is "
        "marked **unstable** in the report and not counted held.",
        "",
        f"{len(both)} claims judged in both runs: {len(both) - len(flips)} read the same "
        f"({len(held_both)} held in both), {len(flips)} flipped"
        + (f" ({', '.join(f'{p.here.mark} / {p.there.mark}' for p in flips)})" if flips else "")
        + (f"; {len(other)} judged on other data in each run (n differs: not compared)" if other else "")
        + (f"; {len(lone)} claims are in one run only" if lone else "")
        + ".",
        "",
        to_markdown(table) if len(table) else "(no verdicts)",
        "",
    ]
    return "\n".join(lines)
