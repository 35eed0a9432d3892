"""Issue 69's budget on seeded synthetic drafters (no model): costs by context corrected online converge to a planted
cost curve, the acceptance calibration learns a drafter whose acceptance follows its match length, and the floor keeps
a budget whose plan is planted to be bad within noise of its best drafter alone (and without the floor it does not)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from specbench.decoding.drafter import Draft
from specbench.errors import SpecbenchError
from specbench.selection import Budget
from specbench.selection.base import Feedback
from specbench.selection.budget import Calibration, Floor, match_bucket
from specbench.selection.costs import ContextCosts, Curve, context_bin

ARMS = ["autoregressive", "ret"]


def true_seconds(n: int, context: int) -> float:
    """A planted verification cost: a step that grows with the cache, nodes that cost more at long contexts."""
    return 0.030 + 0.00002 * context + (0.0008 + 0.000001 * context) * n


def test_a_curve_interpolates_between_its_grid_and_extends_its_last_slope():
    c = Curve([128, 512, 2048], [1.0, 2.0, 5.0])
    assert c(64) == 1.0 and c(128) == 1.0 and c(320) == pytest.approx(1.5) and c(1280) == pytest.approx(3.5)
    assert c(2048 + 1536) == pytest.approx(8.0)  # beyond the grid: the last segment's slope


@pytest.mark.parametrize("profiled", [True, False])
def test_costs_corrected_online_converge_to_a_planted_curve(profiled):
    """A profile measured at one short context only (flat, wrong beyond it), or none: after 600 rounds at contexts
    of 100-3000 tokens with 5% noise, the predicted seconds are within 5% of the planted curve in every context bin
    and at every draft size."""
    rng = random.Random(1)
    profile = (
        {"contexts": [128], "verify": [[0.032, 0.0009]], "draft": {"ret": [0.001]}} if profiled else None
    )
    costs = ContextCosts(["ret"], 0.025, profile)
    for _ in range(600):
        context, n = rng.randint(100, 3000), rng.choice([1, 4, 8, 16])
        costs.observe_verify(n, context, true_seconds(n, context) * rng.uniform(0.95, 1.05))
    for context in (150, 300, 700, 1400, 2800):
        for n in (1, 8, 16):
            assert costs.verify(n, context) == pytest.approx(true_seconds(n, context), rel=0.05), (context, n)
    assert context_bin(100) == 0 and context_bin(128) == 1 and context_bin(3000) == 5


def test_given_costs_are_never_corrected():
    budget = Budget(ARMS, retrieval="ret", models=[], costs={"verify": [0.03, 0.001], "draft": {"ret": 0.0}})
    before = budget.costs.verify(8, 2000)
    budget.costs.observe_verify(8, 2000, 10.0)
    assert budget.costs.verify(8, 2000) == before == pytest.approx(0.038)


def test_costs_by_context_are_read_and_bad_ones_refused():
    by_context = {
        "contexts": [128, 1024],
        "verify": [[0.03, 0.001], [0.05, 0.002]],
        "draft": {"ret": [0.001, 0.003]},
    }
    budget = Budget(ARMS, retrieval="ret", models=[], costs=by_context)
    assert budget.costs.verify(4, 576) == pytest.approx(0.04 + 0.0015 * 4)
    assert budget.costs.draft("ret", 1024) == pytest.approx(0.003)
    for bad in (
        {"contexts": [128, 1024], "verify": [[0.03, 0.001]], "draft": {}},  # one [a, b] for two contexts
        {"contexts": [128], "verify": [[0.03, 0.001]], "draft": {"nope": [0.1]}},  # not a drafter of the pool
        {"contexts": [128], "verify": [[0.0, 0.001]], "draft": {}},  # a forward that costs nothing
    ):
        with pytest.raises(SpecbenchError, match="costs"):
            Budget(ARMS, retrieval="ret", models=[], costs=bad)


def test_the_calibration_learns_acceptance_that_follows_the_match_length():
    """A retrieval drafter whose every token scores 0.5 (one bin) but whose tokens the target accepts with a chance
    that grows with the draft's match length (0.2 at 1 token, 0.5 at 3-4, 0.9 at 9-16): after 4,000 observations
    the cells refined by match length come within 0.04 of the truth, where the score's bin alone says 0.5."""
    truth = {
        1: 0.2,
        3: 0.5,
        5: 0.7,
        6: 0.9,
    }  # match bucket -> acceptance (1: match 1, 3: 3-4, 5: 9-16, 6: 17+)
    lengths = {1: 1, 3: 4, 5: 12, 6: 20}
    rng = random.Random(2)
    cal = Calibration(2.0)
    for _ in range(4000):
        bucket = rng.choice(list(truth))
        key = cal.key(0.5, 1, lengths[bucket])
        assert key == ("score", 5, match_bucket(lengths[bucket]))
        cal.observe(key, rng.random() < truth[bucket])
    for bucket, p in truth.items():
        assert cal.estimate(("score", 5, bucket)) == pytest.approx(p, abs=0.04), bucket
    assert cal.estimate(("score", 5)) == pytest.approx(sum(truth.values()) / 4, abs=0.04)
    assert Calibration(2.0).estimate(("score", 5, 3)) == pytest.approx(
        0.55
    )  # an unseen cell: its bin's prior


def simulate(budget: Budget, rounds: int, seed: int, score: float = 0.9) -> float:
    """The budget decoding one query of ``rounds`` rounds against a planted world: the retrieval drafter proposes 8
    tokens (local scores ``score``, match 12), each accepted with chance 0.9 given its parent; verification costs
    ``true_seconds`` at the row's context, drafting 1 ms. The budget's goodput (emitted tokens a second)."""
    rng = random.Random(seed)
    budget.reset(SimpleNamespace(task="t"))
    tokens = seconds = 0.0
    context = 200
    for _ in range(rounds):
        budget.at(context)
        plan = budget.select()
        drafts = {"ret": Draft(list(range(8)), None, match=12, scores=[score ** (i + 1) for i in range(8)])}
        assert not plan.more(drafts)
        keep = plan.prune(drafts, True)["ret"]
        nodes, accepted = [], 0
        for i in keep:
            ok = rng.random() < 0.9
            nodes.append((i, ok))
            if not ok:
                break
            accepted += 1
        t_verify = true_seconds(len(keep), context) * rng.uniform(0.97, 1.03)
        fb = Feedback(len(keep), accepted, 8, 0.0, 0.0, 0.001, t_verify, 0.0, tuple(nodes))
        budget.update("ret", fb)
        emitted = accepted + 1
        plan.settle(
            SimpleNamespace(emitted=emitted, t_select=0.0, t_draft=0.001, t_verify=t_verify, t_switch=0.0)
        )
        tokens, seconds, context = tokens + emitted, seconds + 0.001 + t_verify, context + emitted
    return tokens / seconds


def alone(seed: int, rounds: int) -> float:
    """The retrieval drafter alone in the same world (every node verified)."""
    rng = random.Random(seed)
    tokens = seconds = 0.0
    context = 200
    for _ in range(rounds):
        accepted = 0
        for _ in range(8):
            if rng.random() >= 0.9:
                break
            accepted += 1
        t = true_seconds(8, context) * rng.uniform(0.97, 1.03) + 0.001
        tokens, seconds, context = tokens + accepted + 1, seconds + t, context + accepted + 1
    return tokens / seconds


def test_the_floor_keeps_a_bad_plan_within_noise_of_its_best_drafter():
    """A plan planted to be bad: the drafter scores each token 0.05 and the calibration's prior is a million
    pseudo-rounds, so the plan expects 0.05 of every token and verifies one of the 8, though each is accepted with
    chance 0.9. Over 64 rounds the floor measures the drafter alone, lets it lead, and keeps the budget's goodput
    within 10% of the drafter alone; without the floor the same plan keeps under 60%."""
    best = sum(alone(s, 64) for s in range(5)) / 5
    planted = {"prior": 1e6, "by_query": False}
    floored = [
        simulate(Budget(ARMS, retrieval="ret", models=[], calibration=planted), 64, s, 0.05) for s in range(5)
    ]
    bare = [
        simulate(Budget(ARMS, retrieval="ret", models=[], calibration=planted, floor=None), 64, s, 0.05)
        for s in range(5)
    ]
    assert sum(floored) / 5 >= 0.90 * best, (floored, best)
    assert sum(bare) / 5 < 0.60 * best, (bare, best)


def test_the_floor_leaves_a_good_plan_leading():
    """The same world with an unbounded plan (it keeps the nodes that pay): after its probes the plan plays most
    rounds, and the budget's goodput is within 10% of the drafter alone."""
    budget = Budget(ARMS, retrieval="ret", models=[])
    labels = []
    original = budget.select

    def select():
        plan = original()
        labels.append(plan.label)
        return plan

    budget.select = select
    got = simulate(budget, 64, 0)
    assert got >= 0.9 * alone(0, 64)
    assert labels[0] == "plan" and labels.count("probe:ret") >= 2


def test_floor_rules():
    floor = Floor(["ret"], probes=2, every=16, z=1.0)
    assert floor.choose() == ("plan", "plan")  # before any measured round: the plan
    floor.observe("plan", 2.0, 1.0)
    assert floor.choose() == ("ret", "probe:ret")  # then each drafter alone, alternating with the plan
    floor.observe("ret", 6.0, 1.0)
    assert floor.choose() == ("plan", "plan")
    floor.observe("plan", 2.2, 1.0)
    floor.observe(
        "ret", 6.2, 1.0
    )  # two probes each: ret's goodput beats the plan's beyond one standard error
    assert floor.leader == "ret" and floor.choose()[1] == "floor:ret"


def test_bad_floor_settings_are_refused_by_the_config_check():
    from specbench.validate import check_arguments

    check_arguments(Budget, {"floor": {"probes": 2, "every": 16, "z": 1.0}}, "selector")
    check_arguments(Budget, {"floor": None}, "selector")
    for bad in ({"probes": 0}, {"every": 1}, {"z": -1.0}, "yes"):
        with pytest.raises(SpecbenchError, match="selector.floor"):
            check_arguments(Budget, {"floor": bad}, "selector")
