"""``Budget``: a cost model that builds each round (``selector=budget``).

Each round it drafts with the retrieval drafter first (nearly free), then decides whether a model drafter (a head
with its dynamic tree) drafts too, then which of all drafted tokens the target verifies, to maximise expected
accepted tokens per predicted second:

- **Acceptance estimates per node.** A drafter's own score of a token (``Draft.scores``: a path probability or a
  retrieval frequency) gives a *local* score (the node's over its parent's); a calibration table per drafter maps
  it (10 bins; drafters without scores: by depth) to the chance the target accepts the token given its parent was
  accepted, a Beta posterior whose prior mean is the score itself (``calibration.prior`` pseudo-rounds). Every verified token
  whose parent was accepted is one observation (``Feedback.nodes``). A node's estimate is the product along its
  path: its expected contribution to the round's accepted tokens.
- **Costs by context** (``selection/costs.py``): verification seconds ``a + b * nodes`` and each drafter's seconds a
  round as functions of the context length (the committed tokens, told by ``Selector.at``): from the start-up profile
  over a grid of contexts that spans the run's (``costs: profile``), interpolated, or fitted online without one; in
  both cases corrected online by context bin from the seconds every round records. Given ``costs`` are never
  corrected: every decision is then independent of the clock.
- **The drafter's own signals.** A retrieval draft's match length (``Draft.match``: the suffix drafter's, prompt
  lookup's n-gram) refines each node's calibration bin (its prior: the bin without it), so a long match's tokens are
  expected as long matches have been kept. With ``calibration.by_query`` (the default) each query also keeps its
  own table, whose prior is the run's.
- **Who drafts.** A model drafter drafts when ``(1 + E_r + G_m) / (t_v(n_r + n_m) + d_r + d_m)`` beats
  ``(1 + E_r) / (t_v(n_r) + d_r)``: ``E_r`` the retrieval draft's expected tokens, ``G_m`` the model's marginal
  tokens (a running mean of what its draft added beyond the retrieval draft's own accepted length, kept apart
  for rounds whose retrieval draft was empty and the rest; optimistic at first: ``calibration.optimism``), ``n_m`` its running mean of
  verified nodes. (Keeping it apart by the retrieval draft's expected tokens as well, in four buckets, measured
  1.608x against the retrieval drafter's 1.672x on tuning rows, mixed_local offset 16, where this rule had
  measured 1.914x against 1.871x: not kept.)
- **Which nodes.** Greedy: nodes in decreasing estimate (a child never outranks its parent), each kept while its
  estimate per second of verification beats the round's running rate, at most ``max_nodes``. Under sampling
  nothing is cut by value (a verified candidate must be an unconditioned draw: ``decoding/tree.py``), so only
  the choice of drafters is made.

The round's expected accepted tokens and predicted seconds are recorded (``Round.expected``, ``Round.predicted_s``)
beside the measured ones. Statistics carry across the queries of a run (the calibration is the run's own). With
``calibration.by_task`` each task (``Query.task``) also keeps its own calibration, whose prior is the run's
estimate: a node is estimated by its task's table and every verdict is learned by both (the run-wide calibration is
off by task where tasks accept differently: docs/budget-decisions-local-cpu.md). With ``calibration.by_query`` each
query keeps one more, started afresh at the query, whose prior is its task's (or the run's) estimate: a query whose
tokens are accepted less (or more) than its task's moves its own estimates after a few rounds. With ``calibration.kept`` every estimate is scaled by the
accepted tokens the rounds before got over those they expected, unscaled (per task with ``by_task``, ``prior``
pseudo-tokens at 1): the budget keeps the nodes whose estimates are highest, so the kept nodes' estimates run high (a
winner's curse) even where each table is right on average, and this factor takes that out of what it expects.

**The floor** (``floor``; null: off). Within each query the budget measures the goodput (emitted tokens over the
round's seconds, a ratio of sums) of its plan and of each of its drafters played alone, every node of its draft
verified: after the plan's first round each drafter is probed alone ``floor.probes`` times (alternating with the
plan), then the option with fewest rounds every ``floor.every`` rounds. The option that plays is the leader: the plan
until an arm's goodput beats the leader's by more than ``floor.z`` standard errors of their difference (the per-round
rates' spread), then that arm (``Round.decided``: ``floor:<arm>``) until another option beats it so. A plan whose
cost model or estimates are wrong thus loses, within the query, to an arm that measures better. With given ``costs``
a round's seconds are its predicted ones (decisions stay clock-free).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated

from specbench.arms import AUTOREGRESSIVE
from specbench.errors import SpecbenchError
from specbench.selection.base import Feedback, Plan, Selector
from specbench.selection.costs import ContextCosts, VerifyCost, profile_of
from specbench.validate import COUNT, Rule, boolean, list_of, mapping, number, text

BINS = 10
PROFILE = "profile"  # costs: measured at start-up on the run's machine, target and pool, cached (pipelines/cost_cache.py)


def match_bucket(match: int) -> int:
    """A match length's signal bucket: 0, 1, 2, 3-4, 5-8, 9-16, then 17 and more."""
    return 0 if match <= 0 else min((int(match) - 1).bit_length() + 1, 6)


class Calibration:
    """Beta posteriors of acceptance by (kind, bin[, match bucket]): the prior mean of a (kind, bin) cell is the bin's
    score (or 0.5 for depth bins), that of a cell refined by the draft's match length is its (kind, bin) cell's estimate;
    with a ``parent`` (a wider calibration: every task's where this is one task's) the parent's estimate."""

    def __init__(self, prior: float, parent: Calibration | None = None):
        self.prior = prior
        self.parent = parent
        self.hits: dict[tuple, float] = {}
        self.trials: dict[tuple, float] = {}

    @staticmethod
    def key(local: float | None, depth: int, match: int | None = None) -> tuple:
        cell = (
            ("depth", min(depth, BINS))
            if local is None
            else ("score", min(int(max(local, 0.0) * BINS), BINS - 1))
        )
        return cell if match is None else (*cell, match_bucket(match))

    def estimate(self, key: tuple) -> float:
        if self.parent is not None:
            mean = self.parent.estimate(key)
        elif len(key) > 2:
            mean = self.estimate(key[:2])
        else:
            mean = 0.5 if key[0] == "depth" else (key[1] + 0.5) / BINS
        return (self.hits.get(key, 0.0) + self.prior * mean) / (self.trials.get(key, 0.0) + self.prior)

    def observe(self, key: tuple, accepted: bool) -> None:
        for k in (key, key[:2]) if len(key) > 2 else (key,):
            self.hits[k] = self.hits.get(k, 0.0) + float(accepted)
            self.trials[k] = self.trials.get(k, 0.0) + 1.0


def fixed_costs(costs, drafters: list[str]) -> dict | None:
    """``costs`` checked, as a profile over contexts (``costs.profile_of``): ``{verify: [a, b], draft: {drafter:
    seconds}}`` (one context), or ``{contexts: [c, ...], verify: [[a, b], ...], draft: {drafter: [seconds, ...]}}``
    (seconds by context); None for None."""
    if costs is None:
        return None
    fix = (
        "set selector.costs to {verify: [seconds a forward, seconds a node], draft: {<drafter>: seconds a round}} "
        "(or by context: {contexts: [c1, c2], verify: [[a1, b1], [a2, b2]], draft: {<drafter>: [s1, s2]}}), "
        f"'{PROFILE}' (measured at start-up, cached per machine) or null to measure them online"
    )
    if costs == PROFILE:
        raise SpecbenchError(
            f"budget: costs: {PROFILE} is measured by the command that runs the budget (specbench "
            "eval) before it builds the selector; nothing measured it here",
            fix,
        )
    try:
        profile = profile_of(costs, drafters)
        contexts = [float(c) for c in profile["contexts"]]
        verify = [(float(a), float(b)) for a, b in profile["verify"]]
        draft = {
            str(k): [float(v)] * len(contexts) if isinstance(v, int | float) else [float(x) for x in v]
            for k, v in profile["draft"].items()
        }
    except (TypeError, ValueError, KeyError, AttributeError):
        raise SpecbenchError(f"budget: costs {costs!r} are not of either form", fix) from None
    unknown = [k for k in draft if k not in drafters]
    if (
        len(verify) != len(contexts)
        or any(len(v) != len(contexts) for v in draft.values())
        or any(a <= 0 or b < 0 for a, b in verify)
        or any(x < 0 for v in draft.values() for x in v)
        or any(c < 0 for c in contexts)
        or unknown
    ):
        raise SpecbenchError(
            "budget: costs need one [a, b] with a > 0, b >= 0 per context, drafting seconds >= 0 per context for "
            f"drafters of the pool, contexts >= 0 (got contexts {contexts}, verify {verify}, draft {draft})",
            fix,
        )
    return {
        "contexts": contexts,
        "verify": verify,
        "draft": {d: draft.get(d, [0.0] * len(contexts)) for d in drafters},
        "profiled": bool(costs.get("profiled", False)),  # measured at start-up: corrected online
    }


def _shape(draft) -> tuple[list[int], list[int], list[tuple[int, ...]]]:
    """A draft's parents, depths and token paths (each token's path from the committed text), computed once."""
    n = len(draft.tokens)
    parents = draft.parents if draft.parents is not None else list(range(-1, n - 1))
    depths: list[int] = []
    paths: list[tuple[int, ...]] = []
    for i, parent in enumerate(parents):
        depths.append(1 if parent < 0 else depths[parent] + 1)
        paths.append((() if parent < 0 else paths[parent]) + (draft.tokens[i],))
    return parents, depths, paths


def _first(draft, k: int):
    """A draft's first ``k`` tokens (a tree's parents precede their children, so they are closed under parents)."""
    if len(draft.tokens) <= k:
        return draft
    cut = lambda xs: None if xs is None else xs[:k]  # noqa: E731
    return dataclasses.replace(
        draft, tokens=draft.tokens[:k], parents=cut(draft.parents), scores=cut(draft.scores)
    )


def _running(old: float | None, new: float, weight: float = 0.1) -> float:
    return new if old is None else (1 - weight) * old + weight * new


PLAN = "plan"


class Floor:
    """The budget's floor within a query (see the module's docstring): each option's measured rounds (``plan`` or a
    drafter alone), the leader, and the probe schedule."""

    def __init__(self, arms: list[str], probes: int = 2, every: int = 16, z: float = 1.0):
        self.arms = list(arms)
        self.probes, self.every, self.z = int(probes), int(every), float(z)
        self.reset()

    def reset(self) -> None:
        self.stats: dict[str, list[float]] = {
            o: [0.0] * 5 for o in (PLAN, *self.arms)
        }  # n, tokens, s, sum r, r^2
        self.leader = PLAN
        self.settled = 0  # rounds measured in this query

    def goodput(self, option: str) -> float:
        n, tokens, seconds, _, _ = self.stats[option]
        return tokens / seconds if n and seconds > 0 else 0.0

    def _se2(self, option: str) -> float:
        n, _, _, s1, s2 = self.stats[option]
        if n < 2:
            return math.inf
        var = max(s2 / n - (s1 / n) ** 2, 0.0) * n / (n - 1)
        return var / n

    def beats(self, challenger: str, leader: str) -> bool:
        """Whether ``challenger``'s goodput exceeds ``leader``'s by more than ``z`` standard errors of the difference."""
        margin = self.z * math.sqrt(self._se2(challenger) + self._se2(leader))
        return self.goodput(challenger) - self.goodput(leader) > margin

    def choose(self) -> tuple[str, str]:
        """This round's option and its label (``plan``, ``probe:<option>``, ``floor:<arm>``)."""
        t = self.settled
        if t >= 1:
            options = [o for o in (PLAN, *self.arms) if o != self.leader]
            short = [o for o in options if self.stats[o][0] < self.probes]
            if short and t % 2 == 1:
                return short[0], f"probe:{short[0]}"
            if not short and t % self.every == 0:
                o = min(options, key=lambda x: self.stats[x][0])
                return o, f"probe:{o}"
        return self.leader, (PLAN if self.leader == PLAN else f"floor:{self.leader}")

    def observe(self, option: str, tokens: float, seconds: float) -> None:
        self.settled += 1
        if seconds <= 0:
            return
        r = tokens / seconds
        for i, v in enumerate((1.0, tokens, seconds, r, r * r)):
            self.stats[option][i] += v
        challengers = [o for o in self.stats if o != self.leader and self.stats[o][0] >= self.probes]
        if challengers:
            best = max(challengers, key=self.goodput)
            if self.beats(best, self.leader):
                self.leader = best


COSTS = Rule(
    lambda v: isinstance(v, dict) or v == "profile",
    "a mapping or 'profile'",
    null=True,
    note=" ({verify: [a, b], draft: {drafter: seconds}}, or by context {contexts: [...], verify: [[a, b], ...], "
    "draft: {drafter: [seconds, ...]}}; profile: measured at start-up over the run's contexts and cached; null: "
    "measured online)",
    keys={
        "contexts": list_of(number(0)),
        "verify": list_of(Rule(lambda v: isinstance(v, list | tuple | int | float), "a number or [a, b]")),
        "draft": mapping(keys={"*": Rule(lambda v: isinstance(v, list | tuple | int | float), "seconds")}),
        "profiled": boolean(),
    },
)

CALIBRATION = mapping(
    null=True,
    note=" ({prior: pseudo-rounds behind each bin's prior, by_task: a table per task too, by_query: a table per "
    "query too, kept: estimates scaled by realised over expected tokens, optimism: a model drafter's added tokens "
    "before it has drafted}; null: {prior: 2.0, by_task: false, by_query: true, kept: false, optimism: 2.0})",
    keys={
        "prior": number(0),
        "by_task": boolean(),
        "by_query": boolean(),
        "kept": boolean(),
        "optimism": number(0),
    },
)

FLOOR = mapping(
    null=True,
    note=" ({probes: rounds each drafter plays alone early in a query, every: rounds between later probes, z: standard "
    "errors an option must beat the leader by}; null: no floor)",
    keys={"probes": number(1), "every": number(2), "z": number(0)},
)
FLOOR_DEFAULTS = {"probes": 2, "every": 16, "z": 1.0}


class Budget(Selector):
    trees = True
    plans = True

    def __init__(
        self,
        arms: list[str],
        retrieval: Annotated[str, text()] = "suffix",
        models: Annotated[list[str] | None, list_of(text(), null=True)] = None,
        max_nodes: Annotated[int, COUNT] = 24,
        node_cost: Annotated[float, number(0)] = 0.025,
        costs: Annotated[dict | str | None, COSTS] = None,
        calibration: Annotated[dict | None, CALIBRATION] = None,
        floor: Annotated[dict | None, FLOOR] = FLOOR_DEFAULTS,
    ):
        super().__init__(arms)
        drafters = [a for a in self.arms if a != AUTOREGRESSIVE]
        if retrieval not in drafters:
            raise SpecbenchError(
                f"budget: no drafter named '{retrieval}' in the pool (retrieval)",
                f"set selector.retrieval to one of: {', '.join(drafters)}",
            )
        self.retrieval = retrieval
        models = [m for m in drafters if m != retrieval] if models is None else [str(m) for m in models]
        unknown = [m for m in models if m not in drafters or m == retrieval]
        if unknown:
            raise SpecbenchError(
                f"budget: {', '.join(unknown)} cannot be a model drafter here (not in the pool, the "
                "autoregressive arm or the retrieval drafter)",
                f"list drafters from: {', '.join(m for m in drafters if m != retrieval)}",
            )
        self.models = models
        self.max_nodes = int(max_nodes)
        settings = {"prior": 2.0, "by_task": False, "by_query": True, "kept": False, "optimism": 2.0}
        settings.update(calibration or {})
        self.calibration = {name: Calibration(float(settings["prior"])) for name in drafters}
        # by_task: one calibration per (task, drafter) besides the run's, its prior the run's estimate
        self.by_task = bool(settings["by_task"])
        self.task_calibration: dict[tuple[str, str], Calibration] = {}
        self._task: str | None = None
        # by_query: one more per drafter for the query being decoded, its prior the task's (or the run's) estimate
        self.by_query = bool(settings["by_query"])
        self.query_calibration: dict[str, Calibration] = {}
        # kept: accepted and expected (unscaled) tokens of the rounds so far, by task (None: every task)
        self.kept = bool(settings["kept"])
        self.totals: dict[str | None, list[float]] = {}
        given = fixed_costs(costs, drafters)
        self.costs = ContextCosts(
            drafters, float(node_cost), given, correct=given is None or bool(given.get("profiled"))
        )
        self.floor = None if floor is None else Floor([retrieval, *models], **{**FLOOR_DEFAULTS, **floor})
        # marginal accepted tokens a model drafter adds, by whether the retrieval draft was empty (True) or not
        self.gain: dict[tuple[str, bool], float] = {
            (m, e): float(settings["optimism"]) for m in models for e in (True, False)
        }
        self.nodes: dict[str, float | None] = {m: None for m in models}
        self._keys: dict[str, list[tuple]] = {}
        self._round: tuple[float, int, float] = (0.0, 0, 0.0)
        self._unscaled = 0.0  # this round's expected tokens before calibration.kept's scale
        self._empty = True  # this round's retrieval draft was empty
        self._context = 0  # the row's committed tokens (Selector.at)
        self._option = PLAN

    def playable(self) -> list[str]:
        return [self.retrieval, *self.models]

    @property
    def fixed(self) -> bool:
        """Given costs: never corrected, and the floor counts a round's predicted seconds (decisions read no clock)."""
        return not self.costs.correct

    def at(self, context: int) -> None:
        self._context = int(context)

    def reset(self, query=None) -> None:
        self._task = getattr(query, "task", None) if self.by_task else None
        self.query_calibration = {}
        if self.floor is not None:
            self.floor.reset()

    def _calibrations(self, name: str) -> list[Calibration]:
        """The calibrations a drafter's nodes are estimated by (the first) and learn into: the query's own (with
        ``by_query``), its task's (with ``by_task``) and the run's, each the prior of the one before."""
        chain = [self.calibration[name]]
        prior = chain[0].prior
        if self._task is not None:
            key = (self._task, name)
            if key not in self.task_calibration:
                self.task_calibration[key] = Calibration(prior, parent=chain[0])
            chain.insert(0, self.task_calibration[key])
        if self.by_query:
            if name not in self.query_calibration:
                self.query_calibration[name] = Calibration(prior, parent=chain[0])
            chain.insert(0, self.query_calibration[name])
        return chain

    # -- one round -------------------------------------------------------------------------------
    def select(self) -> Plan:
        self._keys = {}
        option, label = self.floor.choose() if self.floor is not None else (PLAN, PLAN)
        self._option = option
        if option == PLAN:
            return Plan((self.retrieval,), self._more, self._prune, self._estimate, label, self._settle)
        return Plan((option,), lambda drafts: (), self._all, self._estimate, label, self._settle)

    def _node_estimates(self, name: str, draft, shape=None) -> tuple[list[float], list[tuple]]:
        """Each draft token's estimated chance of being accepted (product along its path), and its calibration key
        (``shape``: the draft's ``_shape`` when already computed)."""
        parents, depths, _ = shape or _shape(draft)
        cal = self._calibrations(name)[0]
        est, keys = [], []
        for i, parent in enumerate(parents):
            local = None
            if draft.scores is not None:
                above = 1.0 if parent < 0 else draft.scores[parent]
                local = draft.scores[i] / above if above > 0 else 0.0
            key = cal.key(local, depths[i], draft.match)
            keys.append(key)
            est.append((1.0 if parent < 0 else est[parent]) * cal.estimate(key))
        f = self._factor()
        return ([min(e * f, 1.0) for e in est] if f != 1.0 else est), keys

    def _factor(self) -> float:
        """``calibration.kept``'s scale of every estimate: accepted over expected (unscaled) tokens of the rounds so
        far, with ``prior`` pseudo-tokens at 1; 1 without it."""
        if not self.kept:
            return 1.0
        got, expected = self.totals.get(self._task, (0.0, 0.0))
        prior = self.calibration[self.retrieval].prior
        return (got + prior) / (expected + prior)

    def _draft_s(self, name: str) -> float | None:
        return self.costs.draft(name, self._context)

    def _more(self, drafts) -> tuple[str, ...]:
        if not self.models:
            return ()
        ret = drafts[self.retrieval]
        est, _ = self._node_estimates(self.retrieval, ret)
        e_r, n_r = sum(est), len(ret.tokens)
        self._empty = n_r == 0
        c = self._context
        d_r = self._draft_s(self.retrieval) or 0.0
        base = (1.0 + e_r) / (self.costs.verify(n_r, c) + d_r)
        best, best_rate = None, base
        for m in self.models:
            d_m = self._draft_s(m)
            if d_m is None:  # never drafted: try it
                return (m,)
            n_m = self.nodes[m] if self.nodes[m] is not None else 4.0
            rate = (1.0 + e_r + self.gain[(m, self._empty)]) / (self.costs.verify(n_r + n_m, c) + d_r + d_m)
            if rate > best_rate:
                best, best_rate = m, rate
        return () if best is None else (best,)

    def _all(self, drafts, greedy: bool = True) -> dict[str, list[int]]:
        """A drafter alone (a probe or the floor's leader): every node of its draft verified (greedy: its first
        ``max_nodes``, parents before children; under sampling nothing is cut)."""
        if greedy:
            drafts = {m: _first(d, self.max_nodes) for m, d in drafts.items()}
        return self._prune(drafts, greedy=False)

    def _prune(self, drafts, greedy: bool = True) -> dict[str, list[int]]:
        spent = sum(self._draft_s(m) or 0.0 for m in drafts)
        shape = {m: _shape(d) for m, d in drafts.items()}  # (parents, depths, paths) of each draft
        scored = {m: self._node_estimates(m, d, shape[m]) for m, d in drafts.items()}
        if not greedy:  # keep every draw (no cut by value keeps the law)
            keep = {m: list(range(len(d.tokens))) for m, d in drafts.items()}
        else:
            a, b = self.costs.coefficients(self._context)
            order = sorted(
                ((e, m, i) for m, (est, _) in scored.items() for i, e in enumerate(est)),
                key=lambda x: (-x[0], shape[x[1]][1][x[2]], x[1], x[2]),
            )
            keep = {m: [] for m in drafts}
            kept = {m: set() for m in drafts}
            paths: set[tuple[int, ...]] = set()
            expected, n = 0.0, 0
            for e, m, i in order:
                parent, path = shape[m][0][i], shape[m][2][i]
                if parent >= 0 and parent not in kept[m]:
                    continue
                if path in paths:  # another member's node with the same path: merged, free
                    keep[m].append(i)
                    kept[m].add(i)
                    continue
                if n >= self.max_nodes or e * (a + b * n + spent) < b * (1.0 + expected):
                    continue
                keep[m].append(i)
                kept[m].add(i)
                paths.add(path)
                expected, n = expected + e, n + 1
        total_expected, seen = 0.0, set()
        for m, chosen in keep.items():
            chosen.sort()
            est, keys = scored[m]
            self._keys[m] = [keys[i] for i in chosen]  # in the cut draft's own indices
            for i in chosen:
                path = shape[m][2][i]
                if path not in seen:
                    seen.add(path)
                    total_expected += est[i]
        self._round = (total_expected, len(seen), self.costs.verify(len(seen), self._context) + spent)
        self._unscaled = total_expected / self._factor()
        return keep

    def _estimate(self) -> tuple[float, float]:
        return self._round[0], self._round[2]

    def _settle(self, rnd) -> None:
        """The floor's measurement of the round: its emitted tokens over its seconds (predicted with given costs)."""
        if self.floor is None:
            return
        seconds = self._round[2] if self.fixed else rnd.t_select + rnd.t_draft + rnd.t_verify + rnd.t_switch
        self.floor.observe(self._option, float(rnd.emitted), seconds)

    # -- learning --------------------------------------------------------------------------------
    def _learn(self, name: str, fb: Feedback, base: int) -> None:
        """One member's feedback; ``base``: the retrieval draft's own accepted tokens this round (0 when absent)."""
        keys = self._keys.get(name, [])
        for i, accepted in fb.nodes:
            if i < len(keys):
                for cal in self._calibrations(name):
                    cal.observe(keys[i], accepted)
        self.costs.observe_draft(name, self._context, fb.t_draft)
        if name in self.nodes and self._option == PLAN:
            key = (name, self._empty)
            self.gain[key] = _running(self.gain[key], float(max(fb.accepted - base, 0)))
            self.nodes[name] = _running(self.nodes[name], float(fb.drafted))

    def _count(self, accepted: int) -> None:
        """``calibration.kept``: the round's accepted tokens against its unscaled expectation."""
        if self.kept:
            got = self.totals.setdefault(self._task, [0.0, 0.0])
            got[0] += float(accepted)
            got[1] += self._unscaled

    def update(self, arm: str, feedback: Feedback) -> None:
        self._learn(arm, feedback, 0)
        self._count(feedback.accepted)
        self.costs.observe_verify(self._round[1], self._context, feedback.t_verify)

    def update_tree(self, feedback: dict[str, Feedback]) -> None:
        base = feedback[self.retrieval].accepted if self.retrieval in feedback else 0
        for name, fb in feedback.items():
            self._learn(name, fb, base)
        self._count(max((fb.accepted for fb in feedback.values()), default=0))
        if feedback:
            self.costs.observe_verify(self._round[1], self._context, next(iter(feedback.values())).t_verify)


__all__ = ["BINS", "Budget", "Calibration", "Floor", "VerifyCost", "fixed_costs"]
