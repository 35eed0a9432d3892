"""One verdict per statement: the claims the seeds (and this project) make, each judged exactly once.

An exhibit judges the comparisons its runs allow (its verdicts: the *parts*). Several parts often test one
statement of a paper: "UCB converges faster than EXP3 and sequential halving" is judged live on speed, live on the
share of the first rounds on the best arm, and replayed against each of the two. Counting every part as a claim
would count one statement many times and split it (one part held, another not). So each statement below names
the parts it is made of (patterns on their claims), and is judged once over all of them as an intersection-union
test (:func:`verdicts.all_of`: held only when every part holds, not held when one does not; its p-value the
largest part's). Holm's correction then runs over the statements of each family (the seeds', this project's),
not over the parts; each part's line on its exhibit page names its statement and the statement's mark.

Each statement is filed in the family of whoever makes it (``family``), whatever exhibit its parts sit in: the
replayed switching-penalty claim is this project's, the live explore-then-commit claims are MetaSD's. A part
that no statement names becomes a statement of its own (its exhibit's family), so it is still judged exactly
once; the CPU plan has none (tested).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import pandas as pd

from specbench.reproduction import verdicts as V
from specbench.reproduction.exhibit import PROJECT, SEED, Exhibit

REPLAYED = "[replayed] "  # the long-horizon exhibit's prefix of a replayed claim


@dataclass(frozen=True)
class Statement:
    key: str  # "<paper>/<name>": how pages name it
    text: str  # the statement, as its paper makes it
    patterns: tuple[
        str, ...
    ]  # regular expressions, searched in each part's claim (the [replayed] prefix dropped)
    family: str = SEED

    def takes(self, claim: str) -> bool:
        bare = claim[len(REPLAYED) :] if claim.startswith(REPLAYED) else claim
        return any(re.search(p, bare) for p in self.patterns)


S = Statement
STATEMENTS: tuple[Statement, ...] = (
    # Huang et al.
    S("huang/specialists", "each specialist drafter speeds up its own task more than the other does (Table 1)",
      (r"^each specialist speeds up its own task",)),
    S("huang/policy-best", "the policy is about as fast as the best drafter on every task (Table 1)",
      (r"^the policy reaches at least .* of the best drafter",)),
    S("huang/policy-ar", "the policy is faster than autoregressive decoding on every task (Table 1)",
      (r"^the policy is faster than autoregressive decoding",)),
    S("huang/alpha", "alpha moves the choice from the cheapest drafter to the best-aligned one (Fig. 2)",
      (r"^the alpha sweep moves the choice",)),
    S("huang/data", "the policy gets faster with more training queries (Fig. 3)",
      (r"^more training queries give a higher speed",)),
    S("huang/math-premise", "on math, drafting alone is slower than autoregressive decoding (Table 4)",
      (r"^the premise: drafting alone slows math",)),
    S("huang/ar-arm", "with the autoregressive arm the policy avoids drafting's slowdown (Tables 4 and 6)",
      (r"^with the autoregressive arm the policy is faster than drafting alone",
       r"^the policy holds at least 0\.95x of autoregressive", r"^adding the autoregressive arm makes the policy")),
    # MetaSD
    S("metasd/accelerates", "MetaSD accelerates decoding in every setting (every source language)",
      (r"^UCB-BD accelerates every",)),
    S("metasd/beats-best", "MetaSD (UCB-BD) is faster than the best single drafter",
      (r"UCB-BD is above the best single drafter", r"^UCB-BD (carried across the stream )?is faster than the best "
       r"single drafter")),
    S("metasd/specialists", "each specialist drafter is the best drafter on its own task",
      (r"^each specialist is the fastest single drafter", r"^each specialist is faster on its task than",
       r"^each specialist has the highest MAT", r"^each specialist has a higher MAT than the generalist")),
    S("metasd/ucb-vs-bandits", "UCB converges faster than EXP3 and sequential halving",
      (r"^UCB-BD is faster than EXP3", r"^UCB-BD reaches the best arm sooner than EXP3",
       r"^UCB-BD plays the best drafter more often than (EXP3|sequential halving)")),
    S("metasd/ucb-vs-uniform", "UCB is faster than the static uniform mixture of drafters",
      (r"^UCB-BD is faster than the static uniform mixture",)),
    S("metasd/bd-variance", "Block Divergence is a lower-variance reward than Block Efficiency",
      (r"^Block Divergence varies less", r"^BE rewards vary more than BD rewards")),
    S("metasd/bd-convergence", "with Block Divergence UCB finds the best drafter sooner than with Block Efficiency",
      (r"^BD reaches the best arm sooner than BE", r"^UCB-BD plays the best drafter more often than UCB-BE")),
    S("metasd/non-stationary", "discounted and sliding-window UCB beat UCB when the best drafter changes",
      (r"D-UCB or SW-UCB is above UCB", r"^(Discounted|Sliding-window) UCB is faster than UCB",
       r"^(Discounted|Sliding-window) UCB plays each query's best")),
    S("metasd/explore-commit", "explore-then-commit beats UCB when a switch costs a prefill",
      (r"^[Ee]xplore-then-commit is faster than UCB-BD", r"^explore-then-commit switches less than UCB-BD")),
    # speculative cascades
    S("cascades/beats-baselines",
      "at the target's quality speculative cascades are faster than lossy SD and the sequential cascade",
      (r"at the target's quality a speculative cascade is faster",)),
    # Spec-Bench (paper scale)
    S("spec_bench/eagle", "EAGLE is the fastest of the reference drafters (Spec-Bench)",
      (r"^EAGLE is the fastest of the reference drafters",)),
    # this project's own
    S("project/full-info-sooner", "full information finds the best head sooner than bandit feedback",
      (r"^full information reaches the best arm sooner",), PROJECT),
    S("project/full-info-faster", "full information is faster than bandit feedback",
      (r"^full information is faster than bandit feedback",), PROJECT),
    S("project/penalty-switches", "a switching penalty cuts drafter switches", (r"^the switching cost cuts",), PROJECT),
    S("project/penalty-faster", "UCB with a switching penalty is faster than plain UCB-BD",
      (r"^the switching-cost variant is faster than UCB-BD", r"^UCB with the measured switching penalty is faster"),
      PROJECT),
)  # fmt: skip
del S

KEYS = {SEED: "statements/seeds", PROJECT: "statements/project"}
TITLES = {
    SEED: "The seeds' statements, one verdict each",
    PROJECT: "This project's statements, one verdict each",
}


def statement_of(claim: str, statements: tuple[Statement, ...] = STATEMENTS) -> Statement | None:
    """The statement a part's claim belongs to (the first that takes it), None when none does."""
    return next((s for s in statements if s.takes(claim)), None)


def grouped(exhibits: list[Exhibit], statements: tuple[Statement, ...] = STATEMENTS):
    """``{statement: [(part name, part verdict), ...]}`` over every verdict of ``exhibits`` (statements exhibits
    excluded), in statement order then the parts no statement takes (each a statement of its own)."""
    found: dict[Statement, list[tuple[str, V.Verdict]]] = {s: [] for s in statements}
    for ex in exhibits:
        if ex.key in KEYS.values():
            continue
        for v in ex.verdicts:
            s = statement_of(v.claim, statements) or Statement(f"{ex.key}: {v.claim}", v.claim, (), ex.family)
            found.setdefault(s, []).append((f"{ex.key}: {v.claim}", v))
    return {s: parts for s, parts in found.items() if parts}


def judge(exhibits: list[Exhibit], statements: tuple[Statement, ...] = STATEMENTS) -> list[Exhibit]:
    """The statements exhibits (one per family that has parts): each statement judged once over its parts
    (:func:`verdicts.all_of`), Holm's correction run over each family's statements."""
    out = []
    by_family = grouped(exhibits, statements)
    for family in (SEED, PROJECT):
        mine = [(s, parts) for s, parts in by_family.items() if s.family == family]
        if not mine:
            continue
        judged = V.holm([V.all_of(s.text, parts, f"{len(parts)} parts") for s, parts in mine])
        table = pd.DataFrame(
            [
                {"statement": s.key, "claim": s.text, "parts": len(parts), "mark": v.mark, "n": v.n}
                for (s, parts), v in zip(mine, judged, strict=True)
            ]
        )
        notes = (
            "Each statement judged once over every exhibit verdict that tests it (its parts), as an "
            "intersection-union test: held only when every part holds, not held when one does not, its p-value the "
            "largest part's; Holm's step-down correction over this family's statements. The parts are on their "
            "exhibits' pages, each at its own level, naming its statement."
        )
        out.append(Exhibit(TITLES[family], table, judged, notes, key=KEYS[family], family=family))
    return out


def annotate(exhibits: list[Exhibit], statements: tuple[Statement, ...] = STATEMENTS) -> None:
    """Each part's line (in place) names its statement and that statement's mark as the statements exhibits have it
    (after Holm, and after a stability check marked it): an exhibit page never shows a part as the final word."""
    final = {(ex.family, v.claim): v.mark for ex in exhibits if ex.key in KEYS.values() for v in ex.verdicts}
    for ex in exhibits:
        if ex.key in KEYS.values():
            continue
        fixed = []
        for v in ex.verdicts:
            s = statement_of(v.claim, statements) or Statement("", v.claim, (), ex.family)
            mark = final.get((s.family, s.text))
            note = f'a part of the statement "{s.text}" ({mark or "not judged"} over all its parts)'
            fixed.append(replace(v, detail=f"{note}; {v.detail}" if v.detail else note))
        ex.verdicts = fixed


def is_statements(ex: Exhibit) -> bool:
    return ex.key in KEYS.values()
