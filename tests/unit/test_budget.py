"""The cost-model budget's pieces on seeded synthetic drafts (no model): its acceptance calibration converges to
the true acceptance of a miscalibrated drafter (and, by task, each task's own), its verification-cost fit recovers a + b * nodes, it keeps the
nodes whose estimate pays for their verification, and it adds a model drafter only where its marginal tokens
pay for its drafting."""

from __future__ import annotations

import random

import pytest

from specbench.decoding.drafter import Draft
from specbench.errors import SpecbenchError
from specbench.selection import Budget
from specbench.selection.base import Feedback
from specbench.selection.budget import BINS, Calibration, VerifyCost

ARMS = ["autoregressive", "ret", "head"]


def synthetic_draft(rng: random.Random, depth: int) -> Draft:
    """A chain whose local scores are uniform in [0, 1] (path scores are their products)."""
    scores, path = [], 1.0
    for _ in range(depth):
        path *= rng.random()
        scores.append(path)
    return Draft(list(range(depth)), None, scores=scores)


def play_round(budget: Budget, rng: random.Random, truth) -> None:
    """One round of the retrieval drafter alone on a synthetic 4-token draft whose token is accepted (given its
    parent) with probability ``truth(local score)``; every node kept, the feedback given."""
    plan = budget.select()
    drafts = {"ret": synthetic_draft(rng, 4)}
    plan.more(drafts)
    keep = plan.prune(drafts, False)  # keep all: every node is observed while its parent is accepted
    draft = drafts["ret"]
    nodes, alive, parent_score = [], True, 1.0
    for i in keep["ret"]:
        if not alive:
            break
        local = draft.scores[i] / parent_score
        ok = rng.random() < truth(local)
        nodes.append((i, ok))
        alive, parent_score = ok, draft.scores[i]
    budget.update(
        "ret",
        Feedback(
            drafted=4,
            accepted=sum(ok for _, ok in nodes),
            n_max=4,
            be=0.0,
            bd=0.0,
            t_draft=0.0,
            t_verify=0.03,
            t_switch=0.0,
            nodes=tuple(nodes),
        ),
    )


def test_calibration_learns_a_miscalibrated_drafter():
    """True acceptance given the parent is local_score ** 2 (the drafter is overconfident); after 3,000 rounds every
    bin's estimate is within 0.05 of the truth at its centre, though its prior said local_score."""
    rng = random.Random(0)
    budget = Budget(ARMS, retrieval="ret", models=["head"], costs={"verify": [0.03, 0.001], "draft": {}})
    for _ in range(3000):
        play_round(budget, rng, lambda local: local**2)
    cal = budget.calibration["ret"]
    for b in range(BINS):
        centre = (b + 0.5) / BINS
        if cal.trials.get(("score", b), 0) > 100:
            assert cal.estimate(("score", b)) == pytest.approx(centre**2, abs=0.05), b


def test_a_calibration_by_task_learns_each_tasks_own_acceptance():
    """Two tasks whose tokens the target accepts differently (local ** 0.5 and local ** 3), their queries
    alternating: with ``by_task`` each task's estimates come within 0.06 of its own truth, while the run-wide
    calibration, which both learn into, lies between them; a new task starts from the run-wide estimate."""
    from types import SimpleNamespace

    rng = random.Random(1)
    budget = Budget(
        ARMS,
        retrieval="ret",
        models=["head"],
        costs={"verify": [0.03, 0.001], "draft": {}},
        calibration={"by_task": True},
    )
    truths = {"easy": lambda local: local**0.5, "hard": lambda local: local**3}
    for q in range(400):
        task = "easy" if q % 2 else "hard"
        budget.reset(SimpleNamespace(task=task))
        for _ in range(10):
            play_round(budget, rng, truths[task])
    run_wide = budget.calibration["ret"]
    checked = 0
    for b in range(BINS):
        key, centre = ("score", b), (b + 0.5) / BINS
        easy, hard = budget.task_calibration[("easy", "ret")], budget.task_calibration[("hard", "ret")]
        if min(easy.trials.get(key, 0), hard.trials.get(key, 0)) > 150:
            assert easy.estimate(key) == pytest.approx(centre**0.5, abs=0.06), b
            assert hard.estimate(key) == pytest.approx(centre**3, abs=0.06), b
            assert hard.estimate(key) < run_wide.estimate(key) < easy.estimate(key)
            checked += 1
    assert checked >= 4
    budget.reset(SimpleNamespace(task="new"))
    fresh = budget._calibrations("ret")[0]
    assert fresh is not run_wide and fresh.estimate(("score", 5)) == run_wide.estimate(("score", 5))
    plain = Budget(ARMS, retrieval="ret", models=["head"], calibration={"by_query": False})
    plain.reset(SimpleNamespace(task="easy"))
    assert plain._calibrations("ret") == [plain.calibration["ret"]]  # by_task off: one run-wide table


def test_a_calibration_by_query_learns_each_querys_own_acceptance():
    """One task whose queries the target accepts differently (each query easy, local ** 0.5, or hard, local ** 3):
    with ``by_query`` a query's own estimates start from the task's (here the run's) and, after 40 rounds, sit far
    nearer its own truth than the run-wide estimate over the well-observed bins where the two kinds differ; the next
    query starts afresh."""
    from types import SimpleNamespace

    rng = random.Random(2)
    budget = Budget(
        ARMS,
        retrieval="ret",
        models=["head"],
        costs={"verify": [0.03, 0.001], "draft": {}},
        calibration={"by_query": True},
    )
    truths = {"easy": lambda local: local**0.5, "hard": lambda local: local**3}
    own_err, run_err = [], []
    for q in range(60):
        kind = "easy" if rng.random() < 0.5 else "hard"
        budget.reset(SimpleNamespace(task="one"))
        run_wide = budget.calibration["ret"]
        fresh = budget._calibrations("ret")[0]
        assert fresh is not run_wide and fresh.estimate(("score", 5)) == run_wide.estimate(("score", 5))
        for _ in range(40):
            play_round(budget, rng, truths[kind])
        own = budget.query_calibration["ret"]
        for b in range(BINS):
            key, centre = ("score", b), (b + 0.5) / BINS
            apart = abs(truths["easy"](centre) - truths["hard"](centre)) > 0.3  # bins where the kinds differ
            if q >= 10 and apart and own.trials.get(key, 0) >= 12:
                truth = truths[kind](centre)
                own_err.append(abs(own.estimate(key) - truth))
                run_err.append(abs(run_wide.estimate(key) - truth))
    assert len(own_err) >= 15
    assert sum(own_err) < 0.5 * sum(run_err)  # the query's own table is far nearer its truth
    both = Budget(ARMS, retrieval="ret", models=["head"], calibration={"by_task": True, "by_query": True})
    both.reset(SimpleNamespace(task="easy"))
    chain = both._calibrations("ret")
    assert (
        len(chain) == 3
        and chain[0].parent is chain[1]
        and chain[1].parent is chain[2] is both.calibration["ret"]
    )


def test_kept_scales_every_estimate_by_what_the_rounds_got_over_what_they_expected():
    """``calibration.kept``: after rounds that got none of the tokens they expected (nothing learned by the tables),
    the next round expects its unscaled tokens times (0 + prior) / (expected so far + prior), in its task only;
    without it the expectation stays."""
    from types import SimpleNamespace

    def expected_after(kept: bool, task: str, rounds: int) -> tuple[float, float]:
        budget = Budget(
            ARMS,
            retrieval="ret",
            models=[],
            costs={"verify": [0.03, 0.0], "draft": {}},
            calibration={"by_task": True, "kept": kept},
        )
        draft = {"ret": Draft([1, 2, 3], None, scores=[0.9, 0.8, 0.7])}
        budget.reset(SimpleNamespace(task="a"))
        spent = 0.0
        for _ in range(rounds):
            plan = budget.select()
            plan.more(draft)
            plan.prune(draft)
            spent += plan.estimate()[0]
            budget.update("ret", Feedback(3, 0, 3, 0.0, 0.0, 0.0, 0.03, 0.0, nodes=()))
        budget.reset(SimpleNamespace(task=task))
        plan = budget.select()
        plan.more(draft)
        plan.prune(draft)
        return plan.estimate()[0], spent

    unscaled, _ = expected_after(False, "a", 5)
    assert expected_after(False, "a", 5)[0] == pytest.approx(unscaled)
    scaled, _ = expected_after(True, "a", 5)
    assert scaled == pytest.approx(unscaled * 2.0 / (5 * unscaled + 2.0))
    assert expected_after(True, "b", 5)[0] == pytest.approx(unscaled)  # another task's rounds scale nothing


def test_verify_cost_fit_recovers_the_line():
    rng = random.Random(1)
    cost = VerifyCost(node_cost=0.5)  # a wrong prior slope, replaced once the rounds vary in size
    for _ in range(200):
        n = rng.randint(1, 20)
        cost.observe(n, 0.030 + 0.0008 * n + rng.gauss(0, 0.0005))
    a, b = cost.coefficients()
    assert a == pytest.approx(0.030, abs=0.001) and b == pytest.approx(0.0008, abs=0.0001)
    assert VerifyCost(0.025).coefficients()[1] == pytest.approx(0.025 * VerifyCost(0.025).coefficients()[0])


def test_prune_keeps_nodes_that_pay_for_their_verification():
    """Given costs (a = 1 s, b = 0.1 s a node) and estimates equal to the drafter's own scores (a huge prior), a node
    is kept while estimate / b beats the round's expected tokens per second so far: a chain of path estimates 0.95,
    0.5225, 0.287, 0.043 keeps three (0.287 / 0.1 = 2.87 > (1 + 1.4725) / 1.2 = 2.06; then 0.43 < 2.76 / 1.3)."""
    budget = Budget(
        ARMS,
        retrieval="ret",
        models=[],
        calibration={"prior": 1e9},
        costs={"verify": [1.0, 0.1], "draft": {"ret": 0.0}},
    )
    plan = budget.select()
    s0 = 0.95  # local scores 0.95, 0.55, 0.55, 0.15: the centres of their bins
    draft = Draft([1, 2, 3, 4], None, scores=[s0, s0 * 0.55, s0 * 0.55**2, s0 * 0.55**2 * 0.15])
    assert plan.prune({"ret": draft}, True) == {"ret": [0, 1, 2]}
    expected, seconds = plan.estimate()
    assert expected == pytest.approx(s0 * (1 + 0.55 + 0.55**2)) and seconds == pytest.approx(1.3)
    # under sampling nothing is cut by value
    assert budget.select().prune({"ret": draft}, False) == {"ret": [0, 1, 2, 3]}


def test_a_model_drafts_only_where_its_marginal_tokens_pay():
    costs = {"verify": [0.04, 0.001], "draft": {"ret": 0.0, "head": 0.012}}
    budget = Budget(ARMS, retrieval="ret", models=["head"], costs=costs, calibration={"optimism": 0.0})
    empty, strong = Draft([], None, scores=[]), Draft([1, 2, 3], None, scores=[0.95, 0.9, 0.85])
    for _ in range(
        50
    ):  # the head adds 2 tokens when retrieval has nothing, 0 beside a strong retrieval draft
        plan = budget.select()
        plan.more({"ret": empty})
        plan.prune({"ret": empty, "head": Draft([5], None)}, True)
        budget.update_tree(
            {
                "ret": Feedback(0, 0, 4, 0, 0, 0, 0.04, 0, ()),
                "head": Feedback(2, 2, 4, 0, 0, 0.012, 0.04, 0, ()),
            }
        )
        budget._empty = False  # a round beside a (strong) retrieval draft
        budget.update_tree(
            {
                "ret": Feedback(3, 3, 4, 0, 0, 0, 0.04, 0, ()),
                "head": Feedback(2, 1, 4, 0, 0, 0.012, 0.04, 0, ()),
            }
        )
    assert budget.select().more({"ret": empty}) == ("head",)  # 2.5 tokens / 0.053 s beats 1 / 0.04 s
    assert budget.select().more({"ret": strong}) == ()  # nothing to add beside it: drafting would only cost


def test_bad_costs_are_refused():
    for bad in ({"verify": [0, 1]}, {"verify": "x"}, {"verify": [0.1, 0.0], "draft": {"nope": 1.0}}):
        with pytest.raises(SpecbenchError, match="costs"):
            Budget(ARMS, retrieval="ret", costs=bad)
    assert Calibration.key(None, 3) == ("depth", 3)
