"""One verdict per statement: the claims the seeds (and this project) make, each judged exactly once.

An exhibit judges the comparisons its runs allow (its verdicts: the *parts*, each with a key ``<exhibit>#<name>``).
Several parts often test one statement of a paper: "UCB converges faster than EXP3 and sequential halving" is judged
replayed against each of the two, and live. So each statement below names the parts it is made of, by key (an exact
key, or a prefix ending in ``*``), and is judged once over all of them as an intersection-union test
(:func:`verdicts.all_of`: held only when every part holds, not held when one does not). Holm's correction then runs
over the statements of each family (the seeds', this project's), not over the parts, for a held and for a not-held
conclusion alike; each part's line on its exhibit page names its statement and the statement's mark.

**Premises.** A part may name the premise its claim presupposes (``premises.py``: a property of the setup, never the
outcome). A part whose premise fails here is **not testable here** with the measured value: it enters neither side of
its statement; a statement with no testable part reads "not testable here". Counted apart from held, not held and
inconclusive everywhere.

**Scope.** The seeds' claims are all listed here, once each, in their own words: those this scale can test have parts;
those it cannot carry their ``scope`` (``paper scale`` or ``theory``) and its reason, and are listed, never judged.
What the seeds propose without claiming a result (D-UCB and SW-UCB, explore-then-commit) is checked as "the method
behaves as designed" in this project's family, not the seeds'.

Each statement is filed in the family of whoever makes it (``family``), whatever exhibit its parts sit in. A part
that no statement names becomes a statement of its own (its exhibit's family), so it is still judged exactly once;
the CPU plan has none (tested).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, replace

import pandas as pd

from specbench.reproduction import verdicts as V
from specbench.reproduction.exhibit import PROJECT, SEED, Exhibit

REPLAYED = "[replayed] "  # the long-horizon exhibit's prefix of a replayed claim
PAPER_SCALE, THEORY = "paper scale", "theory"


@dataclass(frozen=True)
class Statement:
    key: str  # "<paper>/<name>": how pages name it
    text: str  # the statement, as its paper makes it
    parts: tuple[str, ...] = ()  # the part keys it is made of (exact, or a prefix ending in "*")
    family: str = SEED
    source: str = ""  # where the seed makes it (table, figure, section)
    premises: tuple[
        tuple[str, str], ...
    ] = ()  # (part key pattern, premise key): the premise each part presupposes
    scope: str = ""  # "": judged here; "paper scale: <why>" or "theory: <why>": listed, not judged

    def takes(self, key: str) -> bool:
        return bool(key) and any(_match(p, key) for p in self.parts)

    def premise_of(self, key: str) -> str | None:
        return next((prem for pattern, prem in self.premises if _match(pattern, key)), None)

    @property
    def judged(self) -> bool:
        return not self.scope


def _match(pattern: str, key: str) -> bool:
    return fnmatch.fnmatchcase(key, pattern) if "*" in pattern else key == pattern


S = Statement
STATEMENTS: tuple[Statement, ...] = (
    # ---- Huang et al. (context-aware assistant selection)
    S("huang/specialists", "each specialist drafter speeds up its own task more than the other does",
      ("huang/table1#own-task",), source="Table 1"),
    S("huang/mismatch", "a specialist drafter on the other task is slower than autoregressive decoding",
      ("huang/table1#mismatch",), source="Table 1 (T5-small-XSum on IWSLT 0.83x)"),
    S("huang/policy-best", "the policy is about as fast as the best drafter on every task",
      ("huang/table1#policy-within",), source="Table 1",
      premises=(("huang/table1#*", "huang/specialists-differ"),)),
    S("huang/policy-ar", "the policy is faster than autoregressive decoding on every task",
      ("huang/table1#policy-ar",), source="Table 1"),
    S("huang/routing", "the policy routes each query to the specialist of its task",
      ("huang/table1#routing",), source="Table 1 and its discussion",
      premises=(("huang/table1#*", "huang/specialists-differ"),)),
    S("huang/overhead", "choosing a drafter with the policy costs little beside decoding",
      ("huang/table1#overhead",), source="the method's cost (one embedding and an MLP per query)"),
    S("huang/quality", "decoding with the chosen drafter keeps the target's output quality",
      ("huang/table1#quality",), source="Table 1's quality columns"),
    S("huang/alpha", "raising alpha moves the choice from the cheap drafter towards the better-aligned one",
      ("huang/fig2#shift",), source="Fig. 2", premises=(("huang/fig2#*", "huang/alpha-tradeoff"),)),
    S("huang/data", "the policy is useful from a modest number of training queries (1k-10k): with at most 1,000 it "
      "reaches 0.97 of the per-query oracle", ("huang/fig3#efficiency:*",), source="Fig. 3",
      premises=(("huang/fig3#*", "huang/fig3-headroom"),)),
    S("huang/ar-arm-math", "on math, where drafting alone slows decoding, the policy with the autoregressive arm "
      "beats drafting alone and holds about 0.95x of autoregressive speed", ("huang/table4#*",), source="Table 4",
      premises=(("huang/table4#*", "huang/math-slowdown"),)),
    S("huang/ar-arm-depth", "adding the autoregressive arm makes the policy faster",
      ("huang/table6#ar-arm",), source="Table 6", premises=(("huang/table6#*", "huang/depth-slow-arm"),)),
    # ---- MetaSD (multi-drafter speculative decoding as a bandit)
    S("metasd/accelerates", "MetaSD accelerates decoding in every setting",
      ("metasd/main#accelerates", "metasd/multilingual#*"), source="main tables, multilingual table"),
    S("metasd/beats-best", "MetaSD (UCB-BD) is faster than the best single drafter",
      ("metasd/long_horizon#beats-best*", "metasd/seed_live#beats-best", "metasd/main#beats-best"),
      source="main tables", premises=(("*", "metasd/headroom"),)),
    S("metasd/offtask-drop", "a specialist drafter's acceptance drops off its task: on each task its own "
      "specialist has a higher MAT than the other specialists", ("metasd/heads#diagonal", "metasd/long_horizon#diagonal"),
      source="the specialists' acceptance table"),
    S("metasd/ucb-vs-bandits", "UCB converges faster than EXP3 and sequential halving",
      ("metasd/long_horizon#early-vs-exp3", "metasd/long_horizon#early-vs-halving", "metasd/bandits#faster",
       "metasd/bandits#sooner"), source="bandit comparison", premises=(("*", "metasd/horizon"),)),
    S("metasd/ucb-vs-uniform", "UCB is faster than the static uniform mixture of drafters",
      ("metasd/long_horizon#uniform", "metasd/bandits#uniform"), source="bandit comparison",
      premises=(("*", "metasd/horizon"),)),
    S("metasd/bd-variance", "Block Divergence is a lower-variance reward than Block Efficiency",
      ("metasd/variance#heads", "metasd/long_horizon#variance"), source="reward design"),
    S("metasd/bd-discrimination", "Block Divergence tells the best drafter from the second more clearly than Block "
      "Efficiency", ("metasd/long_horizon#discrimination",), source="reward design (denser signal)"),
    S("metasd/bd-convergence", "with Block Divergence UCB finds the best drafter sooner than with Block Efficiency",
      ("metasd/long_horizon#bd-early", "metasd/long_horizon#bd-late", "metasd/convergence#live"),
      source="reward ablation", premises=(("*", "metasd/horizon"),)),
    S("metasd/vs-prompt-level", "choosing a drafter every round beats a prompt-level router trained offline (Huang "
      "et al.'s policy) on the same stream", ("metasd/routing#vs-policy:clean",),
      source="comparison with a classifier router", premises=(("*", "metasd/headroom"),)),
    S("metasd/perturbed", "with perturbed prompts, choosing every round still beats the prompt-level router",
      ("metasd/routing#vs-policy:perturbed",), source="robustness to prompt perturbation",
      premises=(("*", "metasd/headroom"),)),
    S("metasd/ood", "on queries of a task no drafter or router was trained on, choosing every round beats the "
      "prompt-level router", ("metasd/routing#vs-policy:ood",), source="out-of-distribution queries",
      premises=(("*", "metasd/headroom"),)),
    S("metasd/regret", "UCB's regret with Block Divergence grows sublinearly in the rounds", (), source="theorem",
      scope=f"{THEORY}: a bound on expected regret, proved, not measured; the replays measure regret against the "
      "oracles, shown on the replay page"),
    S("metasd/whitebox", "with white-box drafters (EAGLE heads of a 7B target) MetaSD is faster than the best one",
      ("metasd/whitebox#*",), source="white-box table",
      scope=f"{PAPER_SCALE}: the published EAGLE heads of Vicuna-7B need a GPU (make reproduce-paper); the CPU's "
      "heads are the replayed pool above"),
    # ---- speculative cascades
    S("cascades/beats-baselines",
      "at the target's quality speculative cascades are faster than lossy SD and the sequential cascade",
      ("cascades/greedy#at-quality:*", "cascades/sampling#at-quality:*", "cascades/summarization#at-quality:*"),
      source="quality-latency plots", premises=(("*", "cascades/separability"),)),
    S("cascades/curve", "at matched tokens per target call speculative cascades give better quality than lossy SD "
      "and the sequential cascade", ("cascades/summarization#curve:*", "cascades/greedy#curve:*"),
      source="quality-latency plots", premises=(("*", "cascades/separability"),)),
    S("cascades/opt-optimal", "the OPT deferral rule is the optimal deferral rule for its cost-quality objective",
      (), source="theory section", scope=f"{THEORY}: a derivation from the objective, not a measurement; the runs "
      "place OPT among the rules"),
    # ---- Spec-Bench (paper scale)
    S("spec_bench/eagle", "EAGLE is the fastest of the reference drafters",
      ("spec_bench/leaderboard#*",), source="Spec-Bench leaderboard",
      scope=f"{PAPER_SCALE}: the leaderboard's drafters are built for Vicuna-7B on a GPU (make reproduce-paper)"),
    # ---- this project's own
    S("project/full-info-sooner", "full information finds the best head sooner than bandit feedback",
      ("metasd/full_info#sooner",), PROJECT),
    S("project/full-info-faster", "full information is faster than bandit feedback",
      ("metasd/full_info#faster",), PROJECT),
    S("project/penalty-switches", "a switching penalty cuts drafter switches", ("metasd/switching#penalty-fewer",),
      PROJECT),
    S("project/penalty-faster", "UCB with a switching penalty is faster than plain UCB-BD",
      ("metasd/switching#penalty-faster", "metasd/long_horizon#penalty-faster"), PROJECT),
    # the seeds' proposals without a claimed result: checked as "the method behaves as designed"
    S("design/explore-commit", "as designed: explore-then-commit, MetaSD's algorithm for switching costs, switches "
      "less than UCB and is faster than UCB when a switch costs its catch-up",
      ("metasd/long_horizon#etc-fewer", "metasd/long_horizon#etc-faster", "metasd/switching#etc-*"), PROJECT,
      source="MetaSD, switching costs (proposed)", premises=(("*", "metasd/horizon"),)),
    S("design/non-stationary", "as designed: discounted and sliding-window UCB, with memories sized by "
      "Garivier-Moulines' rule, play each segment's best drafter more than UCB when the best drafter changes",
      ("metasd/long_horizon#changing-*", "metasd/stream#live"), PROJECT,
      source="MetaSD, non-stationary streams (proposed)",
      premises=(("metasd/long_horizon#*", "metasd/changing-best"), ("metasd/stream#*", "metasd/horizon"))),
)  # fmt: skip
del S

KEYS = {SEED: "statements/seeds", PROJECT: "statements/project"}
TITLES = {
    SEED: "The seeds' statements, one verdict each",
    PROJECT: "This project's statements, one verdict each",
}

# (premise key, part key) -> its measured value (``premises.Measured``)
PremiseOf = Callable[[str, str], object]


def statement_of(part: V.Verdict | str, statements: tuple[Statement, ...] = STATEMENTS) -> Statement | None:
    """The statement a part belongs to (the first that takes its key), None when none does."""
    key = part if isinstance(part, str) else part.key
    return next((s for s in statements if s.takes(key)), None)


def grouped(exhibits: list[Exhibit], statements: tuple[Statement, ...] = STATEMENTS):
    """``{statement: [(part name, part verdict), ...]}`` over every verdict of ``exhibits`` (statements exhibits and
    exhibits shown but not judged excluded), in statement order then the parts no statement takes (each a statement
    of its own); statements of another scope are left out (never judged)."""
    found: dict[Statement, list[tuple[str, V.Verdict]]] = {s: [] for s in statements if s.judged}
    for ex in exhibits:
        if ex.key in KEYS.values() or not ex.judged:
            continue
        for v in ex.verdicts:
            s = statement_of(v, statements)
            if s is not None and not s.judged:
                continue
            s = s or Statement(f"{ex.key}: {v.claim}", v.claim, (v.key,), ex.family)
            found.setdefault(s, []).append((f"{ex.key}: {v.claim}", v))
    return {s: parts for s, parts in found.items() if parts}


def untestable(v: V.Verdict, measured) -> V.Verdict:
    """``v`` not testable here: its premise failed (``measured``: ``premises.Measured``)."""
    note = f"premise fails: {measured.text}" + (f" ({measured.rows})" if measured.rows else "")
    return replace(
        v,
        held=None,
        reason=V.NOT_TESTABLE,
        p=None,
        p_not=None,
        detail=f"{note}; {v.detail}" if v.detail else note,
    )


def with_premises(s: Statement, parts: list[tuple[str, V.Verdict]], premise_of: PremiseOf | None):
    """The statement's parts with each part's premise applied (a failed premise: not testable here; a held one: its
    value in the part's line), and the premise lines to print beside the statement's verdict."""
    if premise_of is None:
        return parts, []
    out, lines = [], []
    for name, v in parts:
        key = s.premise_of(v.key)
        if key is None:
            out.append((name, v))
            continue
        m = premise_of(key, v.key)
        lines.append(f"premise {key} for {v.key}: {m.line()}")
        if m.holds is False:
            out.append((name, untestable(v, m)))
        elif m.holds is None:
            note = f"premise not measured: {m.text}"
            out.append((name, replace(v, held=None, reason="premise not measured", p=None, p_not=None,
                                      detail=f"{note}; {v.detail}" if v.detail else note)))  # fmt: skip
        else:
            note = f"premise holds: {m.text}"
            out.append((name, replace(v, detail=f"{note}; {v.detail}" if v.detail else note)))
    return out, lines


def judge_statement(
    s: Statement, parts: list[tuple[str, V.Verdict]], premise_of: PremiseOf | None
) -> V.Verdict:
    """One statement over its parts: the parts whose premise fails are set aside (not testable here); the rest are
    judged as one intersection-union test; with none testable the statement is not testable here."""
    parts, lines = with_premises(s, parts, premise_of)
    testable = [(n, v) for n, v in parts if v.reason != V.NOT_TESTABLE]
    detail = f"{len(parts)} parts" + (
        f" ({len(parts) - len(testable)} not testable here)" if len(testable) < len(parts) else ""
    )
    if lines:
        detail += "; " + "; ".join(lines)
    if not testable:
        first = parts[0][1]
        return replace(
            V.all_of(s.text, parts, detail), held=None, reason=V.NOT_TESTABLE, p=None, p_not=None,
            n=first.n, effect=first.effect, interval=first.interval,
        )  # fmt: skip
    v = V.all_of(s.text, testable, detail)
    if len(testable) < len(parts):  # the set-aside parts are listed too, after the judged ones
        listed = "; ".join(f"{n}: {p.mark}, {p.stats}" for n, p in parts if p.reason == V.NOT_TESTABLE)
        v = replace(v, detail=f"{v.detail}; set aside: {listed}")
    return v


def judge(
    exhibits: list[Exhibit],
    statements: tuple[Statement, ...] = STATEMENTS,
    premise_of: PremiseOf | None = None,
    missing: list[str] = (),
) -> list[Exhibit]:
    """The statements exhibits (one per family that has parts): each statement judged once over its parts
    (:func:`judge_statement`), Holm's correction run over each family's statements, for held and not-held
    conclusions alike; ``premise_of(premise, part)`` measures a part's premise (None: premises not applied). A
    statement of the exhibits' kind (a family with parts) whose parts are all missing is kept, not judged, saying
    which data it lacks (``missing``: the report's lines of what is not run yet or damaged), so the family's count of
    statements does not shrink with its data."""
    out = []
    by_family = grouped(exhibits, statements)
    for s in statements:
        if s.judged and s not in by_family and _belongs(s, missing):
            by_family[s] = []
    for family in (SEED, PROJECT):
        mine = [(s, parts) for s, parts in by_family.items() if s.family == family]
        if not any(parts for _, parts in mine):  # a family none of whose exhibits ran is not on the page
            continue
        scoped = [s for s in statements if s.family == family and not s.judged]
        judged = V.holm(
            [judge_statement(s, parts, premise_of) if parts else lacking(s, missing) for s, parts in mine]
        )
        rows = [
            {
                "statement": s.key,
                "claim": s.text,
                "source": s.source,
                "parts": len(parts),
                "mark": v.mark,
                "n": v.n,
            }
            for (s, parts), v in zip(mine, judged, strict=True)
        ]
        rows += [
            {"statement": s.key, "claim": s.text, "source": s.source, "parts": 0, "mark": s.scope.split(":", 1)[0],
             "n": None}
            for s in scoped
        ]  # fmt: skip
        notes = (
            "Each statement judged once over every exhibit verdict that tests it (its parts), as an "
            "intersection-union test: held only when every testable part holds, not held when one does not; a part "
            "whose premise fails here is not testable here (its measured premise in the line) and enters neither "
            "side; Holm's step-down correction over this family's statements, for a held and for a not-held "
            "conclusion alike. The parts are on their exhibits' pages, each at its own level, naming its statement."
            + (
                " Listed, not judged at this scale: "
                + "; ".join(f"{s.key} ({s.scope})" for s in scoped)
                + "."
                if scoped
                else ""
            )
        )
        ex = Exhibit(TITLES[family], pd.DataFrame(rows), judged, notes, key=KEYS[family], family=family)
        ex.scoped = scoped
        out.append(ex)
    return out


def _exhibits_of(s: Statement) -> set[str]:
    """The exhibit keys a statement's parts come from (the part keys' prefixes)."""
    return {p.split("#", 1)[0] for p in s.parts}


def _belongs(s: Statement, missing: list[str]) -> bool:
    """Whether a statement without parts is this report's to count: the runs of one of its exhibits are listed as not
    run yet or damaged (an exhibit of another scale, or outside the plan and not given, is not; nor is a statement an
    exhibit that was built did not give parts to, which stays on the page unjudged as before)."""
    mine = _exhibits_of(s)
    from specbench.reproduction.catalog import EXHIBITS

    runs = {r.dir for spec in EXHIBITS if spec.key in mine for r in spec.runs}
    return any(r in m for m in missing for r in runs)


def lacking(s: Statement, missing: list[str]) -> V.Verdict:
    """A statement whose parts are all missing: not judged, naming what its runs lack (damaged or not run yet)."""
    from specbench.reproduction.catalog import EXHIBITS

    runs = {r.dir for spec in EXHIBITS if spec.key in _exhibits_of(s) for r in spec.runs}
    found = [m for m in missing if any(r in m for r in runs)]
    what = "; ".join(found) or "the runs outside the plan its parts come from were not given to the report"
    damaged = any(m.startswith("damaged:") for m in found)
    return V.Verdict(
        s.text,
        None,
        f"{'its data are damaged' if damaged else 'not run yet'}: {what}",
        n=0,
        reason="damaged data" if damaged else "not run yet",
    )


def refresh_table(ex: Exhibit) -> None:
    """A statements exhibit's table made to agree with its verdicts (after a stability check marked some)."""
    if not is_statements(ex) or ex.table.empty:
        return
    marks = [v.mark for v in ex.verdicts] + list(ex.table["mark"][len(ex.verdicts) :])
    ex.table = ex.table.assign(mark=marks)


def annotate(exhibits: list[Exhibit], statements: tuple[Statement, ...] = STATEMENTS) -> None:
    """Each part's line (in place) names its statement and that statement's mark as the statements exhibits have it
    (after Holm, and after a stability check marked it): an exhibit page never shows a part as the final word."""
    final = {(ex.family, v.claim): v.mark for ex in exhibits if ex.key in KEYS.values() for v in ex.verdicts}
    for ex in exhibits:
        if ex.key in KEYS.values():
            continue
        fixed = []
        for v in ex.verdicts:
            s = statement_of(v, statements) or Statement("", v.claim, (), ex.family)
            if not ex.judged:
                note = "shown, not judged (a robustness row)"
            elif not s.judged:
                note = f'a part of the statement "{s.text}" ({s.scope.split(":", 1)[0]}: not judged here)'
            else:
                mark = final.get((s.family, s.text))
                note = f'a part of the statement "{s.text}" ({mark or "not judged"} over all its parts)'
            fixed.append(replace(v, detail=f"{note}; {v.detail}" if v.detail else note))
        ex.verdicts = fixed


def is_statements(ex: Exhibit) -> bool:
    return ex.key in KEYS.values()
