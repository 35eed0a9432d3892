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
from pathlib import Path

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


TIMED = ("speedup ratio",)  # a verdict on the clock: two processes' timings can differ, so it can flip


def timed(v: V.Verdict | None) -> bool:
    return v is not None and any(v.label.startswith(t) for t in TIMED)


@dataclass
class Groups:
    """A stability check's pairs, grouped: compared in both runs (``both``; ``flips`` among them), judged on other data
    (``other``), in one run only (``lone``) and read off runs outside the plan both reports share (``same``)."""

    both: list[Pair]
    flips: list[Pair]
    other: list[Pair]
    lone: list[Pair]
    same: list[Pair]

    @classmethod
    def of(cls, found: list[Pair], shared: set[str]) -> Groups:
        same = [p for p in found if p.key in shared]
        rest = [p for p in found if p.key not in shared]
        both = [p for p in rest if p.repeated]
        return cls(
            both,
            [p for p in both if p.flipped],
            [p for p in rest if p.here is not None and p.there is not None and not p.repeated],
            [p for p in rest if p.here is None or p.there is None],
            same,
        )

    def stable(self, p: Pair) -> str:
        if p in self.same:
            return "one run, read twice"
        if p in self.other:
            return "other data"
        return "" if p in self.lone else ("no" if p.flipped else "yes")

    def ordered(self) -> list[Pair]:
        return self.flips + [p for p in self.both if not p.flipped] + self.other + self.lone + self.same


def counts(g: Groups) -> str:
    """The page's sentence of counts: compared, the same, held in both, flipped; the timed claims' flip rate."""
    held_both = [p for p in g.both if not p.flipped and p.here.held is True]
    clocked = [p for p in g.both if timed(p.here)]
    clock_flips = [p for p in clocked if p.flipped]
    return (
        f"{len(g.both)} claims judged in both runs: {len(g.both) - len(g.flips)} read the same "
        f"({len(held_both)} held in both), {len(g.flips)} flipped"
        + (f" ({', '.join(f'{p.here.mark} / {p.there.mark}' for p in g.flips)})" if g.flips else "")
        + f". Timed claims (on the clock): {len(clock_flips)} of {len(clocked)} flipped"
        + (f" ({len(clock_flips) / len(clocked):.0%})" if clocked else "")
        + "; the others are on deterministic axes (target rounds, shares, quality) or on other data."
        + (f" {len(g.other)} judged on other data in each run (n differs: not compared)." if g.other else "")
        + (
            f" {len(g.same)} read off runs outside the plan that both reports share (run once: the same data read "
            "twice, they cannot flip; listed last)."
            if g.same
            else ""
        )
        + (f" {len(g.lone)} claims are in one run only." if g.lone else "")
    )


def code_sentence(commits: dict | None) -> str:
    """The second root's code versions (:func:`provenance.commits_under`), "Mixed code" when several."""
    if not commits:
        return ""
    if len(commits) == 1:
        return f"Code of the second run: every run ({sum(len(v) for v in commits.values())}) came from `{next(iter(commits))}`."
    return (
        "**Mixed code** in the second run: "
        + "; ".join(f"`{k}`: {len(v)} runs" for k, v in commits.items())
        + "."
    )


def page(
    found: list[Pair], here: str, there: str, shared: set[str] = frozenset(), commits: dict | None = None
) -> str:
    """``STABILITY.md``: the counts (the flip rate of the timed claims among them), then one row per claim (flips
    first) with its mark and effect in each run. Claims read off data both reports share (``shared``: the exhibits of
    runs outside the plan, run once) are listed apart: they are the same data read twice and cannot flip.
    ``commits``: the second root's code versions."""
    import pandas as pd

    g = Groups.of(found, shared)
    table = pd.DataFrame(
        [
            {
                "exhibit": p.key,
                "claim": p.claim,
                "stable": g.stable(p),
                here: _effect(p.here),
                there: _effect(p.there),
            }
            for p in g.ordered()
        ]
    )
    once = sorted({p.key for p in g.same} | {p.key for p in g.lone})
    code = code_sentence(commits)
    lines = [
        "# Stability: the same plan run twice",
        "",
        f"Built by `specbench report {here} --against {there}`: each verdict of the two runs, paired by exhibit "
        "and claim (each run corrected by Holm within itself). A verdict whose mark differs between the runs is "
        "marked **unstable** in the report and not counted held.",
        "",
        *([code, ""] if code else []),
        counts(g),
        "",
        *(
            [
                "One run (not repeated: their verdicts carry no stability check): "
                + ", ".join(f"`{k}`" for k in once)
                + ".",
                "",
            ]
            if once
            else []
        ),
        to_markdown(table) if len(table) else "(no verdicts)",
        "",
    ]
    return "\n".join(lines)


def fingerprint(root: Path) -> str:
    """A digest of every record file under ``root`` (the generations, collected rows and rounds, by path relative
    to it): two roots with the same fingerprint hold the same records, so one is a copy of the other."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted(Path(root).rglob("*.jsonl")):
        if (
            any(part.startswith(".") for part in path.relative_to(root).parts)
            or "report" in path.relative_to(root).parts
        ):
            continue
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def check_roots(root: Path, other: Path, layout: str, recorded) -> None:
    """Refuse a second root that is the first, a copy of it (the same records), damaged, or of another scale or
    layout (``recorded``: ``render.recorded``, which refuses a damaged ``reproduce.json``)."""
    from specbench.errors import SpecbenchError

    fix = "pass the root of a second run of the same plan: make reproduce-cpu-again writes outputs/reproduce-again"
    if Path(root).resolve() == Path(other).resolve():
        raise SpecbenchError(f"--against {other} is the report's own root", fix)
    mine, theirs = recorded(Path(root)), recorded(Path(other))
    if mine and not theirs:
        raise SpecbenchError(
            f"--against {other} holds no reproduce.json: it is not a root `specbench reproduce` wrote", fix
        )
    for key in ("scale", "layout"):
        a, b = (
            mine.get(key, mine.get("profile") if key == "scale" else None),
            theirs.get(key, theirs.get("profile") if key == "scale" else None),
        )
        if a is not None and b is not None and a != b:
            raise SpecbenchError(f"--against {other} is of another {key} ({b}; the report's root: {a})", fix)
    if fingerprint(Path(root)) == fingerprint(Path(other)):
        raise SpecbenchError(
            f"--against {other} holds the same records as {root} (a copy): it cannot tell whether a verdict stands",
            fix,
        )
