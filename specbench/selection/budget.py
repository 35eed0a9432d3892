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
- **Costs, measured online** (or given: ``costs``, which makes every decision independent of the clock).
  Verification seconds ``a + b * nodes`` by least squares over the rounds played
  (until it has 8 rounds of varied sizes: ``b = node_cost * a``, the profiled 0.025 of a step per node); each
  drafter's drafting seconds a round as a running mean.
- **Who drafts.** A model drafter drafts when ``(1 + E_r + G_m) / (t_v(n_r + n_m) + d_r + d_m)`` beats
  ``(1 + E_r) / (t_v(n_r) + d_r)``: ``E_r`` the retrieval draft's expected tokens, ``G_m`` the model's marginal
  tokens (a running mean of what its draft added beyond the retrieval draft's own accepted length, kept apart
  for rounds whose retrieval draft was empty and the rest; optimistic at first), ``n_m`` its running mean of
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
"""

from __future__ import annotations

from typing import Annotated

from specbench.arms import AUTOREGRESSIVE
from specbench.errors import SpecbenchError
from specbench.selection.base import Feedback, Plan, Selector
from specbench.validate import COUNT, Rule, boolean, list_of, mapping, number, text

BINS = 10
MIN_FIT = 8  # rounds before the verification cost's slope is fitted
PROFILE = "profile"  # costs: measured at start-up on the run's machine, target and pool, cached (pipelines/cost_cache.py)


class Calibration:
    """Beta posteriors of acceptance by (kind, bin): the prior mean is the bin's score (or 0.5 for depth bins), or,
    with a ``parent`` (a wider calibration: every task's where this is one task's), the parent's estimate."""

    def __init__(self, prior: float, parent: Calibration | None = None):
        self.prior = prior
        self.parent = parent
        self.hits: dict[tuple, float] = {}
        self.trials: dict[tuple, float] = {}

    @staticmethod
    def key(local: float | None, depth: int) -> tuple:
        if local is None:
            return ("depth", min(depth, BINS))
        return ("score", min(int(max(local, 0.0) * BINS), BINS - 1))

    def estimate(self, key: tuple) -> float:
        if self.parent is not None:
            mean = self.parent.estimate(key)
        else:
            mean = 0.5 if key[0] == "depth" else (key[1] + 0.5) / BINS
        return (self.hits.get(key, 0.0) + self.prior * mean) / (self.trials.get(key, 0.0) + self.prior)

    def observe(self, key: tuple, accepted: bool) -> None:
        self.hits[key] = self.hits.get(key, 0.0) + float(accepted)
        self.trials[key] = self.trials.get(key, 0.0) + 1.0


class VerifyCost:
    """Seconds of a verification forward over ``n`` nodes: ``a + b n`` fitted online (prior slope ``node_cost * a``)."""

    def __init__(self, node_cost: float):
        self.node_cost = node_cost
        self.s = [0.0] * 5  # count, sum n, sum n^2, sum t, sum n t
        self.fixed: tuple[float, float] | None = None  # given coefficients: nothing is fitted

    def observe(self, n: int, t: float) -> None:
        for i, v in enumerate((1.0, n, n * n, t, n * t)):
            self.s[i] += v

    def coefficients(self) -> tuple[float, float]:
        if self.fixed is not None:
            return self.fixed
        c, sn, snn, st, snt = self.s
        if c == 0:
            return 0.03, 0.03 * self.node_cost  # before any round: a nominal step (only ratios matter)
        var = snn / c - (sn / c) ** 2
        if c >= MIN_FIT and var > 1.0:
            b = max((snt / c - (sn / c) * (st / c)) / var, 0.0)
            return max(st / c - b * sn / c, 1e-6), b
        a = (st / c) / (1.0 + self.node_cost * sn / c)
        return a, self.node_cost * a

    def __call__(self, n: int) -> float:
        a, b = self.coefficients()
        return a + b * n


def fixed_costs(costs, drafters: list[str]) -> tuple[tuple[float, float], dict[str, float]] | None:
    """``costs`` (``{verify: [a, b], draft: {drafter: seconds}}`` or None) checked: verification ``a + b * nodes``
    seconds and each drafter's drafting seconds a round, given instead of measured."""
    if costs is None:
        return None
    fix = (
        "set selector.costs to {verify: [seconds a forward, seconds a node], draft: {<drafter>: seconds a round}}, "
        f"'{PROFILE}' (measured at start-up, cached per machine) or null to measure them online"
    )
    if costs == PROFILE:
        raise SpecbenchError(
            f"budget: costs: {PROFILE} is measured by the command that runs the budget (specbench "
            "eval) before it builds the selector; nothing measured it here",
            fix,
        )
    try:
        a, b = (float(x) for x in costs["verify"])
        draft = {str(k): float(v) for k, v in (costs.get("draft") or {}).items()}
    except (TypeError, ValueError, KeyError, AttributeError):
        raise SpecbenchError(
            f"budget: costs {costs!r} is not {{verify: [a, b], draft: {{drafter: seconds}}}}", fix
        ) from None
    unknown = [k for k in draft if k not in drafters]
    if a <= 0 or b < 0 or any(v < 0 for v in draft.values()) or unknown:
        raise SpecbenchError(
            f"budget: costs need a > 0, b >= 0, drafting seconds >= 0 for drafters of the pool "
            f"(got verify [{a}, {b}], draft {draft})",
            fix,
        )
    return (a, b), {d: draft.get(d, 0.0) for d in drafters}


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


def _running(old: float | None, new: float, weight: float = 0.1) -> float:
    return new if old is None else (1 - weight) * old + weight * new


COSTS = Rule(
    lambda v: isinstance(v, dict) or v == "profile",
    "a mapping or 'profile'",
    null=True,
    note=" ({verify: [a, b], draft: {drafter: seconds}}; profile: measured at start-up and cached; null: measured "
    "online)",
    keys={"verify": list_of(number(0)), "draft": mapping(keys={"*": number(0)})},
)

CALIBRATION = mapping(
    null=True,
    note=" ({prior: pseudo-rounds behind each bin's prior, by_task: a table per task too, by_query: a table per "
    "query too, kept: estimates scaled by realised over expected tokens}; null: {prior: 2.0, by_task: false, "
    "by_query: false, kept: false})",
    keys={"prior": number(0), "by_task": boolean(), "by_query": boolean(), "kept": boolean()},
)


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
        optimism: Annotated[float, number(0)] = 2.0,
        costs: Annotated[dict | str | None, COSTS] = None,
        calibration: Annotated[dict | None, CALIBRATION] = None,
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
        settings = {"prior": 2.0, "by_task": False, "by_query": False, "kept": False, **(calibration or {})}
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
        self.verify_cost = VerifyCost(float(node_cost))
        self.t_draft: dict[str, float | None] = {name: None for name in drafters}
        self.fixed = fixed_costs(costs, drafters)
        if (
            self.fixed is not None
        ):  # given costs: decisions read no clock (reproducible; seeded synthetic tests)
            self.verify_cost.fixed = self.fixed[0]
            self.t_draft.update(self.fixed[1])
        # marginal accepted tokens a model drafter adds, by whether the retrieval draft was empty (True) or not
        self.gain: dict[tuple[str, bool], float] = {
            (m, e): float(optimism) for m in models for e in (True, False)
        }
        self.nodes: dict[str, float | None] = {m: None for m in models}
        self._keys: dict[str, list[tuple]] = {}
        self._round: tuple[float, int, float] = (0.0, 0, 0.0)
        self._unscaled = 0.0  # this round's expected tokens before calibration.kept's scale
        self._empty = True  # this round's retrieval draft was empty

    def playable(self) -> list[str]:
        return [self.retrieval, *self.models]

    def reset(self, query=None) -> None:
        self._task = getattr(query, "task", None) if self.by_task else None
        self.query_calibration = {}

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
        return Plan((self.retrieval,), self._more, self._prune, self._estimate)

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
            key = cal.key(local, depths[i])
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

    def _more(self, drafts) -> tuple[str, ...]:
        if not self.models:
            return ()
        ret = drafts[self.retrieval]
        est, _ = self._node_estimates(self.retrieval, ret)
        e_r, n_r = sum(est), len(ret.tokens)
        self._empty = n_r == 0
        d_r = self.t_draft[self.retrieval] or 0.0
        base = (1.0 + e_r) / (self.verify_cost(n_r) + d_r)
        best, best_rate = None, base
        for m in self.models:
            d_m = self.t_draft[m]
            if d_m is None:  # never drafted: try it
                return (m,)
            n_m = self.nodes[m] if self.nodes[m] is not None else 4.0
            rate = (1.0 + e_r + self.gain[(m, self._empty)]) / (self.verify_cost(n_r + n_m) + d_r + d_m)
            if rate > best_rate:
                best, best_rate = m, rate
        return () if best is None else (best,)

    def _prune(self, drafts, greedy: bool = True) -> dict[str, list[int]]:
        spent = sum(self.t_draft[m] or 0.0 for m in drafts)
        shape = {m: _shape(d) for m, d in drafts.items()}  # (parents, depths, paths) of each draft
        scored = {m: self._node_estimates(m, d, shape[m]) for m, d in drafts.items()}
        if not greedy:  # keep every draw (no cut by value keeps the law)
            keep = {m: list(range(len(d.tokens))) for m, d in drafts.items()}
        else:
            a, b = self.verify_cost.coefficients()
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
        self._round = (total_expected, len(seen), self.verify_cost(len(seen)) + spent)
        self._unscaled = total_expected / self._factor()
        return keep

    def _estimate(self) -> tuple[float, float]:
        return self._round[0], self._round[2]

    # -- learning --------------------------------------------------------------------------------
    def _learn(self, name: str, fb: Feedback, base: int) -> None:
        """One member's feedback; ``base``: the retrieval draft's own accepted tokens this round (0 when absent)."""
        keys = self._keys.get(name, [])
        for i, accepted in fb.nodes:
            if i < len(keys):
                for cal in self._calibrations(name):
                    cal.observe(keys[i], accepted)
        if name in self.t_draft and self.fixed is None:
            self.t_draft[name] = _running(self.t_draft[name], fb.t_draft)
        if name in self.nodes:
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
        self.verify_cost.observe(self._round[1], feedback.t_verify)

    def update_tree(self, feedback: dict[str, Feedback]) -> None:
        base = feedback[self.retrieval].accepted if self.retrieval in feedback else 0
        for name, fb in feedback.items():
            self._learn(name, fb, base)
        self._count(max((fb.accepted for fb in feedback.values()), default=0))
        if feedback:
            self.verify_cost.observe(self._round[1], next(iter(feedback.values())).t_verify)
